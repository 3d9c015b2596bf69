"""Per-episode state for tools: the task, a scratch dict, and lazily entered resources."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any, TypeVar, cast

from agentloop.errors import ToolError

__all__ = ["ToolContext"]

T = TypeVar("T")


class ToolContext:
    """What a tool sees of its episode. Declare a parameter annotated ``ToolContext`` to get it;
    the dispatcher injects it and it never appears in the tool's schema.

    - ``task``: whatever the env passed to ``Toolset.session(task=...)`` (may be ``None``).
    - ``state``: a dict shared by all tool calls of the episode.
    - ``await enter(key, factory)``: enter ``factory()`` (an async context manager, e.g. a sandbox
      session) the first time ``key`` is asked for in this episode and return the same value
      afterwards. Everything entered is exited when the session closes, on every exit path
      (normal end, exception, cancellation), in reverse order.

    Tests can build one directly: ``ctx = ToolContext(task)`` … ``await ctx.aclose()``.
    """

    def __init__(self, task: Any = None) -> None:
        self.task = task
        self.state: dict[str, Any] = {}
        self._stack: AsyncExitStack | None = None  # most episodes enter nothing: made on demand
        self._resources: dict[str, object] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def enter(self, key: str, factory: Callable[[], AbstractAsyncContextManager[T]]) -> T:
        """Return the resource registered under ``key``, entering ``factory()`` on first use.

        Concurrent calls with the same key (several tool calls in one turn) enter it only once.
        If entering fails, nothing is cached and the next call tries again.
        """
        self._check_open(key)
        if key in self._resources:
            return cast(T, self._resources[key])  # stored by this key's factory, a T
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if key in self._resources:
                return cast(T, self._resources[key])  # stored by this key's factory, a T
            self._check_open(key)
            if self._stack is None:
                self._stack = AsyncExitStack()
            value = await self._stack.enter_async_context(factory())
            self._resources[key] = value
            return value

    async def aclose(self) -> None:
        """Exit every entered resource (last entered first). Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self._resources.clear()
        if self._stack is not None:
            await self._stack.aclose()

    async def __aenter__(self) -> ToolContext:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _check_open(self, key: str) -> None:
        if self._closed:
            raise ToolError(
                f"cannot enter resource {key!r}: the episode's tool session is already closed; "
                "use the ToolContext only inside the session that created it"
            )
