"""A heartbeat on the event loop: the longest time the loop went without running it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass
class Lag:
    worst_s: float = 0.0


@contextlib.asynccontextmanager
async def loop_lag(tick_s: float = 0.01) -> AsyncIterator[Lag]:
    """Measure, while the block runs, how late a ``tick_s`` sleep on this loop woke up."""
    lag = Lag()

    async def beat() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(tick_s)
            now = time.perf_counter()
            lag.worst_s = max(lag.worst_s, now - last - tick_s)
            last = now

    task = asyncio.create_task(beat())
    await asyncio.sleep(0)
    try:
        yield lag
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
