"""Waiting in tests: poll a condition until it holds or a deadline passes, never a fixed sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Return as soon as ``condition()`` is true, yielding to the event loop between checks
    (every 5 ms); fail the test if it is still false after ``timeout`` seconds. The deadline is
    generous: a condition that holds returns at once, however loaded the machine."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"condition still false after {timeout} s"
        await asyncio.sleep(0.005)
