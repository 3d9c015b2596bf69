"""ReplicatedEngine routing and broadcast, on small fake replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from agentloop.engines.base import Engine, SamplingParams
from agentloop.engines.router import ReplicatedEngine
from agentloop.errors import ConfigError, InferenceError
from agentloop.types import Completion

SAMPLING = SamplingParams(max_tokens=4)


class Replica:
    """Answers with its own index as the token; holds requests until ``gate`` is set."""

    supports_images = False

    def __init__(self, index: int) -> None:
        self.index = index
        self.gate = asyncio.Event()
        self.gate.set()
        self.sessions: list[str | None] = []
        self.calls: list[tuple[str, Any]] = []

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Completion:
        self.sessions.append(session_id)
        await self.gate.wait()
        return Completion(token_ids=(self.index,), logprobs=(-1.0,), finish_reason="stop")

    async def update_weights(self, named_tensors: Any) -> int:
        names = [name for name, _ in named_tensors]
        self.calls.append(("update_weights", names))
        return len(names)

    async def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        self.calls.append(("wake_up", tags))

    async def start(self) -> None:
        self.calls.append(("start", None))

    async def shutdown(self) -> None:
        self.calls.append(("shutdown", None))


class GenerateOnly:
    supports_images = False

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Completion:
        return Completion(token_ids=(0,), logprobs=(0.0,), finish_reason="stop")


def make(n: int, **kwargs: Any) -> tuple[ReplicatedEngine, list[Replica]]:
    replicas = [Replica(i) for i in range(n)]
    return ReplicatedEngine(replicas, **kwargs), replicas


async def test_is_an_engine_and_spreads_idle_requests_round_robin() -> None:
    router, _ = make(3)
    assert isinstance(router, Engine)
    picks = [(await router.generate([1], SAMPLING)).token_ids[0] for _ in range(6)]
    assert picks == [0, 1, 2, 0, 1, 2]


async def test_least_in_flight_wins() -> None:
    router, replicas = make(2)
    replicas[0].gate.clear()  # replica 0 holds its requests
    held = [asyncio.create_task(router.generate([1], SAMPLING)) for _ in range(1)]
    await asyncio.sleep(0)
    assert router.in_flight == (1, 0)
    # Replica 1 answers at once, so it stays the least loaded and takes every new request.
    picks = [(await router.generate([1], SAMPLING)).token_ids[0] for _ in range(5)]
    assert picks == [1] * 5
    replicas[0].gate.set()
    await asyncio.gather(*held)
    assert router.in_flight == (0, 0)


async def test_concurrent_burst_is_balanced() -> None:
    router, replicas = make(4)
    for r in replicas:
        r.gate.clear()
    tasks = [asyncio.create_task(router.generate([1], SAMPLING)) for _ in range(40)]
    await asyncio.sleep(0)
    assert router.in_flight == (10, 10, 10, 10)
    for r in replicas:
        r.gate.set()
    await asyncio.gather(*tasks)


async def test_session_sticks_to_its_replica_even_when_busy() -> None:
    router, replicas = make(2)
    assert (await router.generate([1], SAMPLING, session_id="a")).token_ids[0] == 0
    replicas[0].gate.clear()
    held = [asyncio.create_task(router.generate([1, 2], SAMPLING, session_id="a"))]
    await asyncio.sleep(0)
    assert router.in_flight == (1, 0)
    # A new session goes to the idle replica, while session "a" stays on the busy one.
    assert (await router.generate([1], SAMPLING, session_id="b")).token_ids[0] == 1
    held.append(asyncio.create_task(router.generate([1, 2, 3], SAMPLING, session_id="a")))
    await asyncio.sleep(0)
    assert router.in_flight == (2, 0)
    replicas[0].gate.set()
    assert [c.token_ids[0] for c in await asyncio.gather(*held)] == [0, 0]
    assert router.replica_of("a") == 0 and router.replica_of("b") == 1


async def test_sessions_pass_through_and_are_spread() -> None:
    router, replicas = make(2)
    for s in ("a", "b", "c", "d"):
        await router.generate([1], SAMPLING, session_id=s)
    assert {router.replica_of(s) for s in "abcd"} == {0, 1}
    assert sorted(replicas[0].sessions + replicas[1].sessions) == ["a", "b", "c", "d"]


async def test_session_table_is_bounded_lru() -> None:
    router, _ = make(2, max_sessions=2)
    await router.generate([1], SAMPLING, session_id="a")
    await router.generate([1], SAMPLING, session_id="b")
    await router.generate([1], SAMPLING, session_id="a")  # a is now the most recent
    await router.generate([1], SAMPLING, session_id="c")
    assert router.replica_of("b") is None
    assert router.replica_of("a") is not None and router.replica_of("c") is not None
    router.release_session("a")
    assert router.replica_of("a") is None


async def test_takes_images_only_when_every_replica_does() -> None:
    class Seeing(Replica):
        supports_images = True

        async def generate(self, *args: Any, images: Sequence[Any] = (), **kw: Any) -> Completion:
            self.calls.append(("images", tuple(images)))
            return await super().generate(*args, **kw)

    assert not ReplicatedEngine([Seeing(0), Replica(1)]).supports_images
    router = ReplicatedEngine([Seeing(0), Seeing(1)])
    assert router.supports_images
    await router.generate([1], SAMPLING, session_id="a", images=("img",))
    picked = router.engines[router.replica_of("a") or 0]
    assert isinstance(picked, Seeing) and ("images", ("img",)) in picked.calls


async def test_failed_request_is_not_left_in_flight() -> None:
    class Failing(Replica):
        async def generate(self, *args: Any, **kwargs: Any) -> Completion:
            raise InferenceError("boom")

    router = ReplicatedEngine([Failing(0)])
    with pytest.raises(InferenceError, match="boom"):
        await router.generate([1], SAMPLING)
    assert router.in_flight == (0,)


async def test_broadcast_reaches_every_replica() -> None:
    router, replicas = make(3)
    weights = ((f"w{i}", None) for i in range(2))  # a one-shot iterator
    assert await router.update_weights(weights) == [2, 2, 2]
    await router.sleep(2)
    await router.wake_up(["weights"])
    for r in replicas:
        assert r.calls == [("update_weights", ["w0", "w1"]), ("sleep", 2), ("wake_up", ["weights"])]


async def test_async_with_starts_and_shuts_down_all() -> None:
    router, replicas = make(2)
    async with router as entered:
        assert entered is router
    for r in replicas:
        assert r.calls == [("start", None), ("shutdown", None)]


async def test_broadcast_to_replica_without_the_method_is_a_clear_error() -> None:
    router = ReplicatedEngine([Replica(0), GenerateOnly()])
    with pytest.raises(InferenceError, match=r"replica\(s\) \[1\].*update_weights"):
        await router.update_weights([])
    async with router:  # start/shutdown are optional
        pass


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="at least one"):
        ReplicatedEngine([])
    with pytest.raises(ConfigError, match="max_sessions"):
        ReplicatedEngine([GenerateOnly()], max_sessions=0)
