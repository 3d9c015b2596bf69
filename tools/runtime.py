"""Running one tool function: per-tool concurrency and rate limits, deadlines, worker threads."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from agentloop.errors import ToolError, ToolFatalError

__all__ = [
    "CANCEL_GRACE_S",
    "STOP_ABANDONED_S",
    "DeadlineExceeded",
    "RuntimeStats",
    "SlotHold",
    "ToolLimiter",
    "call_with_deadline",
    "runtime_stats",
    "shared_limiter",
]

log = logging.getLogger(__name__)

# How long a timed-out (cancelled) async tool may take to unwind before the dispatcher moves on.
CANCEL_GRACE_S = 1.0
# How long a cancelled async tool may go on unwinding after it was abandoned before its coroutine
# is closed: bounds how long one that swallows cancellation can hold up asyncio.run's exit.
STOP_ABANDONED_S = 5.0
_NO_LIMIT: contextlib.AbstractAsyncContextManager[None] = contextlib.nullcontext()


class DeadlineExceeded(Exception):
    """The tool did not finish within its ``timeout_s`` (distinct from a TimeoutError the tool
    raises itself, which is an ordinary tool exception)."""


@dataclass(frozen=True, slots=True)
class RuntimeStats:
    """Calls abandoned at their deadline whose work has not ended (a sync tool's thread, an async
    tool that ignored cancellation): ``running`` now, ``total`` since the process started."""

    abandoned_running: int
    abandoned_total: int


_STATS_LOCK = threading.Lock()
_abandoned = [0, 0]  # running, total


def runtime_stats() -> RuntimeStats:
    """This process's abandoned-call counts (a metric: threads still busy past their deadline)."""
    with _STATS_LOCK:
        return RuntimeStats(*_abandoned)


def _abandoned_change(running: int, total: int) -> None:
    with _STATS_LOCK:
        _abandoned[0] += running
        _abandoned[1] += total


class SlotHold:
    """What ``ToolLimiter.slot()`` yields: ``keep(work)`` makes the slot outlive the call until
    ``work`` (an abandoned call's thread or task) really ends."""

    __slots__ = ("until",)

    def __init__(self) -> None:
        self.until: asyncio.Future[Any] | None = None

    def keep(self, work: asyncio.Future[Any]) -> None:
        self.until = work


class ToolLimiter:
    """Per-tool limits shared by every session and episode that uses a tool of this name (see
    :func:`shared_limiter`).

    ``max_concurrency`` is a semaphore. asyncio primitives bind to the loop that first uses them,
    so there is one semaphore per running event loop (tests, threads and Ray actors may run
    several). ``rate_limit_per_s`` is a token bucket holding one token: call starts are spaced at
    least ``1 / rate`` seconds apart across all loops (a thread lock guards the claim).
    """

    def __init__(self, max_concurrency: int | None, rate_limit_per_s: float | None) -> None:
        self.max_concurrency = max_concurrency
        self.interval_s = 1.0 / rate_limit_per_s if rate_limit_per_s else 0.0
        self._lock = threading.Lock()
        self._next_start = 0.0
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]
        self._semaphores = weakref.WeakKeyDictionary()

    @property
    def unlimited(self) -> bool:
        """True when a call needs no slot: no concurrency limit and no rate limit."""
        return self.max_concurrency is None and not self.interval_s

    def _semaphore(self) -> asyncio.Semaphore | None:
        if self.max_concurrency is None:
            return None
        loop = asyncio.get_running_loop()
        with self._lock:
            sem = self._semaphores.get(loop)
            if sem is None:
                sem = self._semaphores[loop] = asyncio.Semaphore(self.max_concurrency)
            return sem

    async def _wait_for_rate(self) -> None:
        """Wait until a start is allowed and claim it. The next start is set from the moment of
        the claim, not from a booked time, so a late wake-up (a loaded machine) cannot bunch
        two starts closer than ``interval_s``."""
        while True:
            with self._lock:
                now = time.monotonic()
                if now >= self._next_start:
                    self._next_start = now + self.interval_s
                    return
                delay = self._next_start - now
            await asyncio.sleep(delay)

    def slot(self) -> contextlib.AbstractAsyncContextManager[SlotHold | None]:
        """Hold a concurrency slot, then wait for the rate limit, for the duration of one call.

        It yields a :class:`SlotHold` (None when the tool is unlimited): pass its ``keep`` to
        :func:`call_with_deadline` so that a call abandoned at its deadline keeps the slot until
        its work really ends — ``max_concurrency`` counts running threads, not waiting callers.
        """
        if self.unlimited:
            return _NO_LIMIT  # the common case costs no generator, lock or semaphore per call
        return self._limited_slot()

    @asynccontextmanager
    async def _limited_slot(self) -> AsyncIterator[SlotHold]:
        sem = self._semaphore()
        if sem is not None:
            await sem.acquire()
        hold = SlotHold()
        try:
            if self.interval_s:
                await self._wait_for_rate()
            yield hold
        finally:
            if sem is not None:
                work = hold.until
                if work is not None and not work.done():
                    work.add_done_callback(lambda _: sem.release())
                else:
                    sem.release()


_LIMITERS: dict[tuple[str, int | None, float | None], ToolLimiter] = {}
_LIMITERS_LOCK = threading.Lock()


def shared_limiter(
    name: str, max_concurrency: int | None, rate_limit_per_s: float | None
) -> ToolLimiter:
    """The process's limiter of tool ``name`` with these limits.

    Tools are often rebuilt per env instance (per episode); keyed by name, their limits still
    hold across every episode of the process. Two tools of one name with different limits get
    separate limiters (a warning says so).
    """
    if max_concurrency is None and not rate_limit_per_s:
        return ToolLimiter(None, None)  # nothing to share
    key = (name, max_concurrency, rate_limit_per_s)
    with _LIMITERS_LOCK:
        limiter = _LIMITERS.get(key)
        if limiter is None:
            others = [k for k in _LIMITERS if k[0] == name]
            if others:
                log.warning(
                    "tool %r is built with max_concurrency=%s, rate_limit_per_s=%s, but also "
                    "with %s; each setting is limited separately",
                    name,
                    max_concurrency,
                    rate_limit_per_s,
                    [k[1:] for k in others],
                )
            limiter = _LIMITERS[key] = ToolLimiter(max_concurrency, rate_limit_per_s)
        return limiter


def _consume_result(fut: asyncio.Future[Any]) -> None:
    # An abandoned call may still fail later; fetch its exception so asyncio does not log it.
    if not fut.cancelled():
        fut.exception()


def _start_thread(
    loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], kwargs: Mapping[str, Any], name: str
) -> tuple[asyncio.Future[Any], asyncio.Future[None]]:
    """Run ``fn(**kwargs)`` on a fresh daemon thread: its outcome lands in the first future, the
    second is done when the thread ends (also after the first was cancelled).

    Not ``asyncio.to_thread``: the default executor has few workers (cores + 4), so sync tools
    that hang past their timeout would fill it and stall every later sync tool, and
    ``asyncio.run`` waits for its threads at shutdown. A daemon thread that hangs costs only
    itself.
    """
    fut: asyncio.Future[Any] = loop.create_future()
    ended: asyncio.Future[None] = loop.create_future()
    ctx = contextvars.copy_context()

    def deliver(ok: bool, value: Any) -> None:
        if not ended.done():
            ended.set_result(None)
        if fut.done():
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def target() -> None:
        try:
            outcome = (True, ctx.run(fn, **kwargs))
        except (KeyboardInterrupt, asyncio.CancelledError) as e:
            outcome = (False, _escaped(name, e))  # re-raised on the loop, it would end the run
        except BaseException as e:
            outcome = (False, e)
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(deliver, *outcome)

    threading.Thread(target=target, name=f"agentloop-tool-{name}", daemon=True).start()
    return fut, ended


async def call_with_deadline(
    fn: Callable[..., Any],
    kwargs: Mapping[str, Any],
    *,
    is_async: bool,
    timeout_s: float,
    name: str,
    keep: Callable[[asyncio.Future[Any]], None] | None = None,
) -> Any:
    """Call the tool function and return its value, or raise ``DeadlineExceeded``.

    Async tools run as their own task, cancelled at the deadline (and given ``CANCEL_GRACE_S`` to
    unwind; one that ignores cancellation is abandoned, not awaited forever). Sync tools run on a
    daemon thread that is abandoned at the deadline (Python cannot kill a thread). An abandoned
    call's work is passed to ``keep`` (a :class:`SlotHold`'s: its slot stays taken until the work
    ends) and counted in :func:`runtime_stats`.
    """
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[Any]
    if is_async:
        fut: asyncio.Future[Any] = loop.create_task(_contained(fn(**kwargs), name))
        ended = fut
    else:
        fut, ended = _start_thread(loop, fn, kwargs, name)
    # What asyncio.wait({fut}, timeout) does, minus its per-call set, partial and bookkeeping:
    # one waiter woken by the call's end or by the deadline, whichever comes first.
    waiter = loop.create_future()
    wake = functools.partial(_wake, waiter)
    fut.add_done_callback(wake)
    deadline = loop.call_later(timeout_s, wake, None)
    try:
        await waiter
    finally:
        deadline.cancel()
        fut.remove_done_callback(wake)
        finished = fut.done()
        if not finished:
            fut.cancel()
            fut.add_done_callback(_consume_result)
            if is_async:  # one that ignores the cancel is stopped later
                loop.call_later(STOP_ABANDONED_S, _stop_abandoned, fut, name)
    if not finished:
        if is_async:
            await asyncio.wait({fut}, timeout=CANCEL_GRACE_S)
        if not ended.done():
            _abandoned_change(1, 1)
            ended.add_done_callback(lambda _: _abandoned_change(-1, 0))
            if keep is not None:
                keep(ended)
        raise DeadlineExceeded(f"tool {name!r} timed out after {timeout_s}s")
    return fut.result()


async def _contained(coro: Coroutine[Any, Any, Any], name: str) -> Any:
    """Await an async tool. What it raises that would stop the whole event loop
    (``KeyboardInterrupt``, ``SystemExit``) or pass for a cancellation of its caller (a
    ``CancelledError`` nobody asked for) becomes an error naming the tool."""
    try:
        return await coro
    except asyncio.CancelledError as e:
        task = asyncio.current_task()
        if task is None or task.cancelling():  # a real cancel: the deadline or the episode's
            raise
        raise _escaped(name, e) from e
    except KeyboardInterrupt as e:
        raise _escaped(name, e) from e
    except SystemExit as e:  # an ordinary tool exception, as for sync tools
        raise ToolError(f"raised SystemExit({e.code!r})") from e


def _escaped(name: str, exc: BaseException) -> ToolFatalError:
    return ToolFatalError(
        f"tool {name!r} raised {type(exc).__name__}; a tool must not raise it (it would cancel "
        "or stop every episode), so this episode ends here"
    )


def _stop_abandoned(task: asyncio.Future[Any], name: str) -> None:
    """Stop an async tool that ignored its cancellation for ``STOP_ABANDONED_S``: close its
    coroutine (``GeneratorExit`` at its await), else keep ``asyncio.run`` from waiting on it at
    exit. Without this one tool swallowing ``CancelledError`` hangs the program's shutdown."""
    if task.done() or not isinstance(task, asyncio.Task):
        return
    log.warning(
        "tool %r ignored its cancellation for %ss; closing its coroutine", name, STOP_ABANDONED_S
    )
    try:
        task.get_coro().close()
    except RuntimeError:  # it swallowed GeneratorExit too: nothing can stop it
        log.error("tool %r cannot be stopped (it ignores GeneratorExit); abandoning it", name)
        asyncio.tasks._unregister_task(task)  # so asyncio.run's shutdown does not wait forever
        return
    task.cancel()  # wakes the task; its closed coroutine then ends it


def _wake(waiter: asyncio.Future[None], _: object) -> None:
    if not waiter.done():
        waiter.set_result(None)
