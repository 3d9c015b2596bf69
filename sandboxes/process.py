"""Kernels and one-shot runs as local child processes (for the `local` and unsafe backends)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agentloop.errors import SandboxError
from agentloop.sandboxes.base import ExecResult
from agentloop.sandboxes.cgroups import Cgroup
from agentloop.sandboxes.protocol import Capture, SectionMarks, SectionReader, StreamKernel

__all__ = ["ProcessKernel", "collect_process", "exit_status"]

_WAIT_S = 5.0


def exit_status(returncode: int | None) -> int:
    """A shell-style status: ``128 + signal`` for a process killed by a signal."""
    if returncode is None:
        return 137
    return 128 - returncode if returncode < 0 else returncode


class ProcessKernel(StreamKernel):
    """A kernel running as a local process (bwrap from a launcher, or the bare interpreter).

    ``proc`` has ``stdin``/``stdout``/``stderr`` streams, ``wait()`` and ``returncode``;
    ``kill`` kills the whole kernel; ``cgroup`` (if any) counts OOM kills; ``on_close`` releases
    what the kernel ran on (its launcher, its work dir).
    """

    def __init__(
        self,
        proc: Any,
        key: str,
        max_output_bytes: int,
        *,
        kill: Callable[[], None],
        cgroup: Cgroup | None = None,
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        marks = SectionMarks(key)
        stdout, stderr = SectionReader(proc.stdout, marks), SectionReader(proc.stderr, marks)
        super().__init__(stdout, stderr, max_output_bytes, key)
        self.proc = proc
        self.cgroup = cgroup
        self._kill = kill
        self._on_close = on_close
        self._closed = False

    async def _send(self, data: bytes) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        stdin.write(data)
        await stdin.drain()

    async def kill(self) -> None:
        self._kill()

    async def exit_code(self) -> int | None:
        try:
            async with asyncio.timeout(_WAIT_S):
                return exit_status(await self.proc.wait())
        except (TimeoutError, SandboxError):
            return None

    async def oom_events(self) -> int:
        return self.cgroup.oom_kills() if self.cgroup is not None else 0

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.alive = False
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        await self.kill()
        await self.exit_code()
        if self._on_close is not None:
            await self._on_close()


async def _drain(reader: asyncio.StreamReader | None, sink: Capture) -> None:
    if reader is None:
        return
    while chunk := await reader.read(1 << 16):
        sink.add(chunk)


async def collect_process(
    proc: asyncio.subprocess.Process,
    *,
    stdin: str | None,
    timeout_s: float,
    max_output_bytes: int,
    kill: Callable[[], None],
    oom: Callable[[], bool] = lambda: False,
) -> ExecResult:
    """Feed ``stdin``, capture capped output, enforce the wall clock; return the run's result."""
    start = time.perf_counter()
    out, err = Capture(max_output_bytes), Capture(max_output_bytes)
    timed_out = False

    async def feed() -> None:
        if proc.stdin is None:
            return
        with contextlib.suppress(ConnectionError, OSError):
            if stdin:
                proc.stdin.write(stdin.encode())
                await proc.stdin.drain()
            proc.stdin.close()

    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(feed(), _drain(proc.stdout, out), _drain(proc.stderr, err))
            await proc.wait()
    except TimeoutError:
        timed_out = True
        kill()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_WAIT_S):
                await proc.wait()
    duration = time.perf_counter() - start
    code = exit_status(proc.returncode)
    stderr = err.text()
    # MemoryError is how an address-space rlimit (no memory cgroup) shows up
    last_line = stderr.rstrip().rpartition("\n")[2]
    oom_killed = not timed_out and (oom() or last_line.startswith("MemoryError"))
    if timed_out:
        code = 137
        stderr += f"\n[sandbox] run timed out after {timeout_s:g}s and was killed\n"
    elif code == 128 + signal.SIGXCPU:
        timed_out = True
        stderr += "\n[sandbox] run exceeded its CPU-time limit and was killed\n"
    return ExecResult(
        stdout=out.text(),
        stderr=stderr,
        exit_code=137 if oom_killed else code,
        timed_out=timed_out,
        oom_killed=oom_killed,
        duration_s=duration,
        truncated=out.truncated or err.truncated,
    )
