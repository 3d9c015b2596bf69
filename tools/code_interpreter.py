"""The code-interpreter tool: Python in the episode's sandbox session, its result as model text."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agentloop.errors import ConfigError, SandboxError, ToolError
from agentloop.sandboxes import ExecResult, Sandbox
from agentloop.sandboxes.shared import shared_sandbox
from agentloop.sandboxes.spec import SandboxConfig, SandboxSpec, sandbox_spec
from agentloop.tools.context import ToolContext
from agentloop.tools.tool import Tool, tool

__all__ = ["code_interpreter", "code_interpreter_tool", "format_exec_result"]

_SESSION_KEY = "code_interpreter.session"
_GRACE_S = 30.0  # the sandbox enforces the run's timeout; the tool deadline only backs it up


def format_exec_result(result: ExecResult, timeout_s: float | None = None) -> str:
    """stdout, then stderr, then what went wrong, in the words a model can act on."""
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr.strip():
        parts.append("[stderr]\n" + result.stderr.strip("\n"))
    if result.timed_out:
        limit = f" of {timeout_s:g}s" if timeout_s else ""
        parts.append(
            f"Error: the code ran past its time limit{limit} and was stopped; "
            "make it faster or do less per call. Variables from earlier calls are lost."
        )
    elif result.oom_killed:
        parts.append(
            "Error: the code ran out of memory and was stopped; use less memory. "
            "Variables from earlier calls are lost."
        )
    elif result.exit_code != 0 and not result.stderr.strip():
        parts.append(f"(exit status {result.exit_code})")
    if result.truncated:
        parts.append("[output truncated: print less]")
    return "\n".join(parts) if parts else "(no output; use print() to see values)"


def _run_code(sandbox: Sandbox | SandboxSpec, timeout_s: float, key: str) -> Callable[..., Any]:
    async def run_code(code: str, ctx: ToolContext) -> str:
        """Run Python code in a persistent interpreter and see what it prints.

        Variables, imports and files persist between calls in this conversation. Use print()
        to show results. There is no network access.

        Args:
            code: The Python code to run.
        """
        try:
            box = await _open(sandbox)
            await box.start()
            session: Any = await ctx.enter(key, box.session)
            result = await session.run(code, timeout_s=timeout_s)
        except SandboxError as exc:
            raise ToolError(f"the sandbox could not run the code: {exc}") from exc
        return format_exec_result(result, timeout_s)

    return run_code


async def _open(sandbox: Sandbox | SandboxSpec) -> Sandbox:
    return await shared_sandbox(sandbox) if isinstance(sandbox, SandboxSpec) else sandbox


def _preflight(sandbox: Sandbox | SandboxSpec) -> Callable[[], Awaitable[None]]:
    async def preflight() -> None:
        box = await _open(sandbox)  # a shared one is started (a remote pool checks its servers)
        await box.start()

    return preflight


# The schema comes from run_code's signature and docstring, the same for every sandbox: build it
# once and rebind only the function (inspecting a function costs ~1 ms; envs are made per episode).
_TEMPLATE = tool(name="code_interpreter")(_run_code(SandboxSpec("local"), 30.0, _SESSION_KEY))


def code_interpreter_tool(
    sandbox: Sandbox | SandboxConfig = "local",
    *,
    timeout_s: float = 30.0,
    name: str = "code_interpreter",
    max_concurrency: int | None = None,
    rate_limit_per_s: float | None = None,
) -> Tool:
    """A ``code_interpreter`` tool (named ``name``) running Python in ``sandbox``.

    ``sandbox`` is a started-on-first-use :class:`Sandbox` you own, or a setting — a backend
    name, server URLs, or a backend with its options (:func:`~agentloop.sandboxes.sandbox_spec`):
    then the event loop's shared sandbox of that setting is used (``shared_sandbox``; the default
    is a local bubblewrap sandbox, closed when the loop shuts down). Each episode gets its own
    session — variables, imports and files persist across the episode's calls and never leak to
    another episode — which closes with the episode's tool session. Each call may run ``timeout_s``
    seconds; ``max_concurrency`` and ``rate_limit_per_s`` limit the calls of tool ``name``
    across every episode of the process. A sandbox failure becomes an error observation
    (``ToolError``); the tool's ``preflight`` starts the sandbox (see ``Env.preflight``).
    """
    if isinstance(sandbox, str | Mapping | SandboxSpec):
        sandbox = sandbox_spec(sandbox)
    elif not hasattr(sandbox, "session"):
        raise ConfigError(
            f"sandbox must be a Sandbox, a backend name like 'local', server URLs or a mapping "
            f"with 'backend', got {sandbox!r}"
        )
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
        raise ConfigError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    key = f"{_SESSION_KEY}.{name}"  # two interpreter tools in one env keep separate sessions
    fn = _run_code(sandbox, timeout_s, key)
    return dataclasses.replace(
        _TEMPLATE,
        name=name,
        fn=fn,
        timeout_s=timeout_s + _GRACE_S,
        max_concurrency=max_concurrency,
        rate_limit_per_s=rate_limit_per_s,
        preflight=_preflight(sandbox),
    )


#: The default tool: the event loop's shared local bubblewrap sandbox, 30 s per call.
code_interpreter = code_interpreter_tool()
