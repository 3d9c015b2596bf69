"""The code-interpreter tool: Python in the episode's sandbox session, its result as model text."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from agentloop.errors import SandboxError, ToolError
from agentloop.sandboxes import ExecResult, Sandbox, make_sandbox
from agentloop.tools.context import ToolContext
from agentloop.tools.tool import Tool, tool

__all__ = ["code_interpreter", "code_interpreter_tool", "format_exec_result"]

_SESSION_KEY = "code_interpreter.session"
_GRACE_S = 30.0  # the sandbox enforces the run's timeout; the tool deadline only backs it up
# One default local sandbox per event loop (asyncio resources belong to the loop that made them).
_defaults: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Sandbox] = (
    weakref.WeakKeyDictionary()
)


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


async def _default_sandbox() -> Sandbox:
    loop = asyncio.get_running_loop()
    sandbox = _defaults.get(loop)
    if sandbox is None:
        sandbox = _defaults[loop] = make_sandbox("local")
    return sandbox


def code_interpreter_tool(
    sandbox: Sandbox | None = None, *, timeout_s: float = 30.0, name: str = "code_interpreter"
) -> Tool:
    """A ``code_interpreter`` tool running in ``sandbox`` (default: a local bubblewrap sandbox,
    started on first use). Each episode gets its own session — variables, imports and files
    persist across the episode's calls and never leak to another episode — which closes with
    the episode's tool session. A sandbox failure becomes an error observation (``ToolError``).
    """

    async def run_code(code: str, ctx: ToolContext) -> str:
        """Run Python code in a persistent interpreter and see what it prints.

        Variables, imports and files persist between calls in this conversation. Use print()
        to show results. There is no network access.

        Args:
            code: The Python code to run.
        """
        box = sandbox or await _default_sandbox()
        try:
            await box.start()
            session: Any = await ctx.enter(_SESSION_KEY, box.session)
            result = await session.run(code, timeout_s=timeout_s)
        except SandboxError as exc:
            raise ToolError(f"the sandbox could not run the code: {exc}") from exc
        return format_exec_result(result, timeout_s)

    return tool(name=name, timeout_s=timeout_s + _GRACE_S)(run_code)


#: The default tool: a local bubblewrap sandbox, 30 s per call.
code_interpreter = code_interpreter_tool()
