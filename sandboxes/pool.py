"""Shared machinery of kernel backends: a pool of pre-warmed kernels, sessions, and the run path."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import weakref
from collections.abc import AsyncIterator, Coroutine, Mapping
from typing import Any

from agentloop.errors import ConfigError, SandboxError
from agentloop.sandboxes.base import (
    ExecResult,
    SandboxLimits,
    check_code,
    check_files,
    check_language,
)
from agentloop.sandboxes.protocol import StreamKernel

__all__ = ["KernelPool", "KernelSandbox", "PooledSession"]

log = logging.getLogger(__name__)


class KernelPool:
    """Keeps ``size`` kernels ready, refilled in the background ``max_starting`` at a time."""

    def __init__(self, sandbox: KernelSandbox, size: int, max_starting: int = 2) -> None:
        self._sandbox = sandbox
        self.size = size
        self._ready: list[StreamKernel] = []
        self._starting: set[asyncio.Task[None]] = set()
        self._gate = asyncio.Semaphore(max_starting)
        self._closed = False
        self.last_error: BaseException | None = None

    def fill(self) -> None:
        """Start enough background spawns to get back to ``size`` ready kernels."""
        while not self._closed and len(self._ready) + len(self._starting) < self.size:
            task = asyncio.get_running_loop().create_task(self._spawn_one())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _spawn_one(self) -> None:
        try:
            async with self._gate:
                kernel = await self._sandbox._spawn_kernel()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # surfaced by the next direct spawn; the pool stops refilling
            self.last_error = exc
            log.warning("sandbox pool could not start a kernel: %s", exc)
            return
        if self._closed:
            await kernel.close()
        else:
            self._ready.append(kernel)

    def take(self) -> StreamKernel | None:
        """A ready kernel, or None if none is ready right now (refill starts either way)."""
        while self._ready:
            kernel = self._ready.pop()
            if kernel.alive:
                self.fill()
                return kernel
        if self.last_error is None:
            self.fill()
        return None

    async def acquire(self) -> StreamKernel:
        """A ready kernel, or a freshly started one when the pool is empty."""
        kernel = self.take()
        if kernel is not None:
            return kernel
        kernel = await self._sandbox._spawn_kernel()
        self.last_error = None
        return kernel

    async def close(self) -> None:
        self._closed = True
        for task in list(self._starting):
            task.cancel()
        await asyncio.gather(*self._starting, return_exceptions=True)
        ready, self._ready = self._ready, []
        await asyncio.gather(*(k.close() for k in ready), return_exceptions=True)


class PooledSession:
    """A stateful session on one kernel; a kernel lost to a timeout/OOM is replaced on next run."""

    def __init__(self, sandbox: KernelSandbox) -> None:
        self.id = secrets.token_hex(8)
        self._sandbox = sandbox
        self._kernel: StreamKernel | None = None
        self._lock = asyncio.Lock()
        self.closed = False

    async def run(
        self,
        code: str,
        *,
        language: str = "python",
        timeout_s: float | None = None,
        stdin: str | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ) -> ExecResult:
        if language != "python":
            raise ConfigError(
                f"sessions run Python only, got language={language!r}; "
                "use sandbox.run(code, language=...) for one-off runs"
            )
        sb = self._sandbox
        timeout = sb.limits.run_timeout(timeout_s)
        code, blobs = check_code(code), check_files(files)
        async with self._lock:
            if self.closed:
                raise SandboxError(f"session {self.id} is closed; open a new one")
            if self._kernel is None or not self._kernel.alive:
                self._kernel = await sb._pool_or_raise().acquire()
            kernel = self._kernel
            result = await kernel.execute(
                code, timeout_s=timeout, cpu_s=sb._cpu_s(timeout), stdin=stdin, files=blobs
            )
            if not kernel.alive:
                self._kernel = None
                await kernel.close()
            return result

    async def close(self) -> None:
        async with self._lock:
            self.closed = True
            kernel, self._kernel = self._kernel, None
        if kernel is not None:
            await kernel.close()


class KernelSandbox:
    """Base of the kernel backends (local, subprocess_unsafe, docker).

    Subclasses implement ``_spawn_kernel`` (a started, handshaken kernel) and may override
    ``_cold_run`` (a run without a pre-warmed kernel) and ``_prepare``.
    """

    name = "kernel"
    languages: tuple[str, ...] = ("python",)

    def __init__(self, *, limits: SandboxLimits | None = None, pool_size: int = 4) -> None:
        if limits is not None and not isinstance(limits, SandboxLimits):
            raise ConfigError(f"limits must be a SandboxLimits, got {type(limits).__name__}")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 0:
            raise ConfigError(f"pool_size must be an integer >= 0, got {pool_size!r}")
        self.limits = limits or SandboxLimits()
        self.pool_size = pool_size
        self._pool: KernelPool | None = None
        self._sessions: weakref.WeakSet[PooledSession] = weakref.WeakSet()
        self._start_lock: asyncio.Lock | None = None
        self._closing: set[asyncio.Task[Any]] = set()

    async def _prepare(self) -> None:
        """One-time checks and setup before the first kernel starts."""

    async def _spawn_kernel(self) -> StreamKernel:
        raise NotImplementedError

    async def _cold_run(
        self, code: str, language: str, timeout_s: float, stdin: str | None, files: dict[str, bytes]
    ) -> ExecResult:
        kernel = await self._spawn_kernel()
        try:
            return await kernel.execute(
                code, timeout_s=timeout_s, cpu_s=self._cpu_s(timeout_s), stdin=stdin, files=files
            )
        finally:
            await kernel.close()

    def _cpu_s(self, timeout_s: float) -> float:
        return min(self.limits.cpu_limit_s, timeout_s) if self.limits.cpu_time_s else timeout_s

    async def start(self) -> None:
        if self._pool is not None:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._pool is None:
                await self._prepare()
                self._pool = KernelPool(self, self.pool_size)
                self._pool.fill()

    def _pool_or_raise(self) -> KernelPool:
        if self._pool is None:
            raise SandboxError(
                f"{self.name} sandbox is not started; use `async with sandbox:` or await start()"
            )
        return self._pool

    async def close(self) -> None:
        sessions = list(self._sessions)
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        await asyncio.gather(*list(self._closing), return_exceptions=True)

    async def __aenter__(self) -> Any:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(
        self,
        code: str,
        *,
        language: str = "python",
        timeout_s: float | None = None,
        stdin: str | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ) -> ExecResult:
        """Run once in a fresh interpreter: a pre-warmed kernel if one is ready, else cold."""
        check_language(language, self.languages)
        timeout = self.limits.run_timeout(timeout_s)
        code, blobs = check_code(code), check_files(files)
        pool = self._pool_or_raise()
        kernel = pool.take() if language == "python" else None
        if kernel is None:
            return await self._cold_run(code, language, timeout, stdin, blobs)
        try:
            return await kernel.execute(
                code, timeout_s=timeout, cpu_s=self._cpu_s(timeout), stdin=stdin, files=blobs
            )
        finally:
            self._discard(kernel)

    def _discard(self, kernel: StreamKernel) -> None:
        """Close a used kernel in the background (the caller has its result already)."""
        kernel.alive = False
        self._background(kernel.close())

    def _background(self, work: Coroutine[Any, Any, Any]) -> None:
        """Clean-up off the request path; awaited by :meth:`close`."""
        task = asyncio.get_running_loop().create_task(work)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[PooledSession]:
        """A stateful interpreter, released (processes killed) when the block exits."""
        self._pool_or_raise()
        sess = PooledSession(self)
        self._sessions.add(sess)
        try:
            yield sess
        finally:
            await sess.close()
