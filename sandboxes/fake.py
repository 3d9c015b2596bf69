"""FakeSandbox: a scripted in-process sandbox for fast unit tests of tools and envs (unisolated)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import sys
import time
import traceback
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentloop.errors import SandboxError
from agentloop.sandboxes.base import (
    ExecResult,
    SandboxLimits,
    check_code,
    check_files,
    check_language,
)

__all__ = ["FakeCall", "FakeSandbox", "FakeSession"]

Response = ExecResult | str
Script = Sequence[Response] | Callable[[str, dict[str, Any]], Response]
_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class FakeCall:
    """One recorded run: its inputs, the session it ran in (None: one-shot), and its result."""

    code: str
    language: str
    session_id: str | None
    stdin: str | None
    files: Mapping[str, bytes]
    result: ExecResult


def exec_in_process(code: str, namespace: dict[str, Any], stdin: str | None = None) -> ExecResult:
    """Run trusted test code with ``exec`` in this process, capturing stdout/stderr."""
    out, err = io.StringIO(), io.StringIO()
    exit_code = 0
    start = time.perf_counter()
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin or "")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            exec(compile(code, "<string>", "exec"), namespace)
    except SystemExit as exc:
        exit_code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None
        err.write("".join(traceback.format_exception(type(exc), exc, tb)))
        exit_code = 1
    finally:
        sys.stdin = old_stdin
    duration = time.perf_counter() - start
    return ExecResult(out.getvalue(), err.getvalue(), exit_code, duration_s=duration)


class FakeSession:
    """A session of :class:`FakeSandbox`: its own namespace, so state persists and never leaks."""

    def __init__(self, sandbox: FakeSandbox) -> None:
        self.id = f"fake-{next(_ids)}"
        self.namespace: dict[str, Any] = {"__name__": "__main__"}
        self._sandbox = sandbox

    async def run(
        self,
        code: str,
        *,
        language: str = "python",
        timeout_s: float | None = None,
        stdin: str | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ) -> ExecResult:
        return await self._sandbox._run(code, language, timeout_s, stdin, files, self)


class FakeSandbox:
    """Plays a script instead of running code in isolation — for unit tests only.

    ``script`` is a list of responses (the i-th run gets the i-th; an :class:`ExecResult` or a
    ``str`` taken as stdout), or a function ``(code, namespace) -> response``. Without a script the
    code is *executed in this process* with ``exec`` (trusted test code only!), in a per-session
    namespace. ``latency_s`` is awaited per run; ``fail_after=n`` raises SandboxError from the
    n-th run on (backend-failure tests). Every run is recorded in ``calls``.
    """

    name = "fake"

    def __init__(
        self,
        script: Script | None = None,
        *,
        limits: SandboxLimits | None = None,
        latency_s: float = 0.0,
        fail_after: int | None = None,
    ) -> None:
        self.script = script
        self.limits = limits or SandboxLimits()
        self.latency_s = latency_s
        self.fail_after = fail_after
        self.calls: list[FakeCall] = []
        self.open_sessions = 0
        self.started = False

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.started = False

    async def __aenter__(self) -> FakeSandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _respond(self, code: str, namespace: dict[str, Any], stdin: str | None) -> ExecResult:
        if self.script is None:
            return exec_in_process(code, namespace, stdin)
        if callable(self.script):
            response = self.script(code, namespace)
        else:
            if len(self.calls) >= len(self.script):
                raise SandboxError(
                    f"FakeSandbox script exhausted after {len(self.script)} runs; add responses"
                )
            response = self.script[len(self.calls)]
        return ExecResult(response, "", 0) if isinstance(response, str) else response

    async def _run(
        self,
        code: str,
        language: str,
        timeout_s: float | None,
        stdin: str | None,
        files: Mapping[str, bytes | str] | None,
        session: FakeSession | None,
    ) -> ExecResult:
        check_language(language)
        self.limits.run_timeout(timeout_s)
        code, blobs = check_code(code), check_files(files)
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise SandboxError(f"FakeSandbox: simulated backend failure on run {len(self.calls)}")
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        namespace = session.namespace if session else {"__name__": "__main__"}
        result = self._respond(code, namespace, stdin)
        sid = session.id if session else None
        self.calls.append(FakeCall(code, language, sid, stdin, blobs, result))
        return result

    async def run(
        self,
        code: str,
        *,
        language: str = "python",
        timeout_s: float | None = None,
        stdin: str | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ) -> ExecResult:
        return await self._run(code, language, timeout_s, stdin, files, None)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[FakeSession]:
        self.open_sessions += 1
        try:
            yield FakeSession(self)
        finally:
            self.open_sessions -= 1
