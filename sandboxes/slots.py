"""A pool of launcher slots (see ``launcher.py``): reused across runs and kernels, bounded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from agentloop.sandboxes.base import SandboxLimits
from agentloop.sandboxes.cgroups import CgroupRoot
from agentloop.sandboxes.launcher import Launcher, drop_launcher, start_launcher

__all__ = ["SlotPool"]

log = logging.getLogger(__name__)


class SlotPool:
    """Launchers reused sandbox after sandbox. Cold runs ``take()`` one of at most ``max_slots``
    (waiting for a free one beyond that, which also bounds concurrent cold sandboxes); kernels
    ``take(bounded=False)`` and hold theirs while they live. Extra slots go when released."""

    def __init__(
        self, root: CgroupRoot | None, limits: SandboxLimits, python: str, max_slots: int = 32
    ) -> None:
        self._root, self._limits, self._python = root, limits, python
        self._max = max_slots
        self._free: list[Launcher] = []
        self._all: set[Launcher] = set()
        self._count = 0
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def prewarm(self, n: int) -> None:
        for _ in range(min(n, self._max - self._count)):
            self._count += 1
            self._spawn(self._add_new())

    async def _new(self) -> Launcher:
        slot = await start_launcher(self._root, self._limits, self._python)
        self._all.add(slot)
        return slot

    async def _add_new(self) -> None:
        try:
            slot = await self._new()
        except Exception as exc:
            log.warning("could not start a sandbox launcher: %s", exc)
            self._count -= 1
            return
        await self._put(slot)

    async def _put(self, slot: Launcher) -> None:
        async with self._changed:
            self._free.append(slot)
            self._changed.notify()

    async def take(self, bounded: bool = True) -> Launcher:
        """A free slot: a reused one, a new one (up to ``max_slots`` if ``bounded``), or the
        next one released."""
        while True:
            async with self._changed:
                while self._free:
                    slot = self._free.pop()
                    if slot.alive:
                        return slot
                    self._count -= 1
                    self._spawn(self._drop(slot))
                if self._count < self._max or not bounded:
                    self._count += 1
                    break
                await self._changed.wait()
        try:
            return await self._new()
        except BaseException:
            self._count -= 1
            raise

    def release(self, slot: Launcher) -> None:
        """Back to the pool once nothing but the launcher is left in its cgroup."""
        self._spawn(self._scrub(slot))

    async def _scrub(self, slot: Launcher) -> None:
        cg = slot.cgroup
        for _ in range(200):
            if not slot.alive or slot.running or cg is None or not cg.pids() - {slot.pid}:
                break
            cg.kill_all(exclude={slot.pid})
            await asyncio.sleep(0.01)
        clean = slot.alive and not slot.running and (cg is None or not cg.pids() - {slot.pid})
        if clean and self._count <= self._max:
            await self._put(slot)
        else:
            await self._drop(slot)
            async with self._changed:
                self._count -= 1
                self._changed.notify()

    async def _drop(self, slot: Launcher) -> None:
        # the slot stays ours until its drop is done: a drop cancelled halfway (the pool
        # closing) is finished by close(), cgroup and any sandbox that escaped the kill included
        await drop_launcher(slot)
        self._all.discard(slot)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        slots, self._free, self._all = list(self._all), [], set()
        await asyncio.gather(*(drop_launcher(s) for s in slots), return_exceptions=True)
