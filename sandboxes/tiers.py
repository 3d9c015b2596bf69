"""Sandboxes with a lower memory limit than the server's, made on demand for requests that ask."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from agentloop.errors import ConfigError
from agentloop.sandboxes.admission import too_many
from agentloop.sandboxes.base import Sandbox, SandboxLimits

__all__ = ["LimitsFactory", "MemoryTiers"]

log = logging.getLogger(__name__)

#: Builds a sandbox of the server's backend with other limits (``serve`` passes one).
LimitsFactory = Callable[[SandboxLimits], Sandbox]


@dataclass(slots=True)
class _Tier:
    sandbox: Sandbox
    users: int = 0
    last_used: float = 0.0


class MemoryTiers:
    """A request's memory limit below the server's runs on a sandbox of the same backend built
    with that limit (a cgroup or rlimit is set when a sandbox starts, not per run); above it,
    on the server's own. At most ``max_tiers`` such sandboxes live at once: a new limit
    replaces the least recently used idle one; when every one is busy, the request runs on the
    busy tier just below it (tighter still) or, with none, gets 429 and retries.
    """

    def __init__(
        self, base: Sandbox, factory: LimitsFactory | None = None, max_tiers: int = 4
    ) -> None:
        self.base, self.factory, self.max_tiers = base, factory, max_tiers
        self._tiers: dict[int, _Tier] = {}
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def limits(self) -> tuple[int, ...]:
        """The memory limits (MB) that have a sandbox now, lowest first."""
        return tuple(sorted(self._tiers))

    @contextlib.asynccontextmanager
    async def use(self, memory_mb: int | None) -> AsyncIterator[Sandbox]:
        """The sandbox to run a request with ``memory_mb`` (None: the server's) on."""
        if memory_mb is None or memory_mb >= self.base.limits.memory_mb:
            yield self.base
            return
        if self.factory is None:
            raise ConfigError(
                f"memory limit {memory_mb} MB is below this server's {self.base.limits.memory_mb}"
                " MB and this server was built without a backend factory to lower it; leave "
                "the memory limit out"
            )
        tier = await self._tier(memory_mb)
        tier.users += 1
        try:
            yield tier.sandbox
        finally:
            tier.users -= 1
            tier.last_used = time.monotonic()

    async def _tier(self, memory_mb: int) -> _Tier:
        async with self._lock:
            tier = self._tiers.get(memory_mb)
            if tier is not None:
                return tier
            if len(self._tiers) >= self.max_tiers and not self._evict_idle():
                lower = [mb for mb in self._tiers if mb < memory_mb]
                if lower:
                    return self._tiers[max(lower)]
                raise too_many(
                    "Busy",
                    f"{self.max_tiers} other memory limits are in use on this server; retry later",
                    **{"Retry-After": "1"},
                )
            assert self.factory is not None
            limits = dataclasses.replace(self.base.limits, memory_mb=memory_mb)
            sandbox = self.factory(limits)
            await sandbox.start()
            log.info("started a sandbox with memory limit %d MB for requests that ask", memory_mb)
            tier = self._tiers[memory_mb] = _Tier(sandbox, last_used=time.monotonic())
            return tier

    def _evict_idle(self) -> bool:
        idle = [(t.last_used, mb) for mb, t in self._tiers.items() if not t.users]
        if not idle:
            return False
        tier = self._tiers.pop(min(idle)[1])
        task = asyncio.get_running_loop().create_task(tier.sandbox.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return True

    async def close(self) -> None:
        """Close every tier (the server's own sandbox is its owner's to close)."""
        tiers, self._tiers = list(self._tiers.values()), {}
        await asyncio.gather(
            *(t.sandbox.close() for t in tiers), *self._closing, return_exceptions=True
        )
