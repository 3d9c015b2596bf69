"""ReplicatedEngine: several engine replicas behind one Engine, sticky per trajectory."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from agentloop.engines.base import Engine, SamplingParams, generate
from agentloop.errors import ConfigError, InferenceError
from agentloop.types import Completion

if TYPE_CHECKING:
    import torch

__all__ = ["ReplicatedEngine"]

log = logging.getLogger(__name__)


class ReplicatedEngine:
    """Routes each request to one of ``engines`` (data-parallel replicas of one model).

    A request without a known ``session_id`` goes to the replica with the fewest requests in
    flight (ties: the one least recently picked). Every later request of the same
    ``session_id`` goes to the same replica, so the turns of one trajectory reuse that
    replica's prefix cache. The session table keeps the ``max_sessions`` most recently used
    sessions. ``update_weights``, ``sleep``, ``wake_up``, ``reset_prefix_cache``, ``start`` and
    ``shutdown`` are sent to every replica at once; ``async with`` starts and stops them all.
    """

    def __init__(self, engines: Sequence[Engine], *, max_sessions: int = 65536) -> None:
        self.engines = tuple(engines)
        if not self.engines:
            raise ConfigError("ReplicatedEngine needs at least one engine")
        if max_sessions < 1:
            raise ConfigError(f"max_sessions must be >= 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self._in_flight = [0] * len(self.engines)
        self._last_pick = [0] * len(self.engines)  # pick counter value when last chosen
        self._picks = 0
        self._sessions: OrderedDict[str, int] = OrderedDict()

    @property
    def supports_images(self) -> bool:
        """Whether every replica takes images."""
        return all(e.supports_images for e in self.engines)

    @property
    def in_flight(self) -> tuple[int, ...]:
        """Requests in flight per replica."""
        return tuple(self._in_flight)

    def replica_of(self, session_id: str) -> int | None:
        """The replica a session is pinned to, if it has one."""
        return self._sessions.get(session_id)

    def release_session(self, session_id: str) -> None:
        """Forget a finished session (optional: old sessions age out of the table anyway)."""
        self._sessions.pop(session_id, None)

    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[Any] = (),
    ) -> Completion:
        index = self._pick(session_id)
        self._in_flight[index] += 1
        try:
            return await generate(
                self.engines[index], prompt_ids, sampling, session_id=session_id, images=images
            )
        finally:
            self._in_flight[index] -= 1

    def _pick(self, session_id: str | None) -> int:
        if session_id is not None and (index := self._sessions.get(session_id)) is not None:
            self._sessions.move_to_end(session_id)
            return index
        index = min(
            range(len(self.engines)), key=lambda i: (self._in_flight[i], self._last_pick[i])
        )
        self._picks += 1
        self._last_pick[index] = self._picks
        if session_id is not None:
            self._sessions[session_id] = index
            if len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        return index

    # ------------------------------------------------------------------ broadcast
    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[Any]:
        """Load the same weights into every replica; returns each replica's result."""
        tensors = list(named_tensors)  # an iterator can be read only once
        return await self._broadcast("update_weights", lambda fn: fn(tensors))

    async def sleep(self, level: int = 1) -> None:
        await self._broadcast("sleep", lambda fn: fn(level))

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        await self._broadcast("wake_up", lambda fn: fn(tags))

    async def reset_prefix_cache(self) -> None:
        await self._broadcast("reset_prefix_cache", lambda fn: fn())

    async def start(self) -> None:
        await self._broadcast("start", lambda fn: fn(), optional=True)

    async def shutdown(self) -> None:
        """Shut every replica down, even when one of them fails to."""
        results = await asyncio.gather(
            *(e.shutdown() for e in self.engines if hasattr(e, "shutdown")),
            return_exceptions=True,
        )
        self._sessions.clear()
        if errors := [r for r in results if isinstance(r, BaseException)]:
            raise InferenceError(f"{len(errors)} replica(s) failed to shut down: {errors[0]!r}")

    async def __aenter__(self) -> ReplicatedEngine:
        try:
            await self.start()
        except BaseException:
            await self.shutdown()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def _broadcast(
        self,
        method: str,
        call: Callable[[Callable[..., Awaitable[Any]]], Awaitable[Any]],
        *,
        optional: bool = False,
    ) -> list[Any]:
        fns = [getattr(e, method, None) for e in self.engines]
        if not optional and (missing := [i for i, fn in enumerate(fns) if fn is None]):
            raise InferenceError(
                f"replica(s) {missing} ({type(self.engines[missing[0]]).__name__}) have no "
                f"{method}(); every replica must support it"
            )
        return list(await asyncio.gather(*(call(fn) for fn in fns if fn is not None)))
