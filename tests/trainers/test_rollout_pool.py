"""RolloutPool failover on fake actors (no Ray cluster, no vLLM): a dead worker's request is sent
again, the worker is replaced, it serves only after the trainer pushed its weights to it (during
the trainer's wait), and a replacement that cannot start stops the run. The real thing:
test_disagg_ray.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

pytest.importorskip("ray")

from ray.exceptions import ActorDiedError

from agentloop.engines.base import SamplingParams
from agentloop.errors import InferenceError
from agentloop.trainers.disagg import RolloutPool
from agentloop.types import Completion


class _Method:
    def __init__(self, fn: Callable[..., Awaitable[Any]]) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Awaitable[Any]:
        return self.fn(*args)


class FakeWorker:
    """A rollout actor: ``generate`` answers with its own index until it is ``killed``."""

    def __init__(self, name: str, *, start_fails: bool = False) -> None:
        self.name, self.killed, self.version, self.start_fails = name, False, 0, start_fails
        self.release = asyncio.Event()
        self.release.set()
        methods = ("start", "generate", "join_push_group", "receive_weights", "weight_dtype")
        for m in (*methods, "ping", "close"):
            setattr(self, m, _Method(getattr(self, f"_{m}")))

    async def _start(self) -> tuple[int, ...]:
        if self.start_fails:
            raise RuntimeError("no GPU left")
        return ()

    async def _generate(
        self, ids: list[int], sampling: Any, session: Any, images: Any = ()
    ) -> Completion:
        await self.release.wait()
        if self.killed:
            raise ActorDiedError()
        return Completion((len(self.name),), (-0.5,), "stop", (self.version,))

    async def _join_push_group(self, *args: Any) -> None:
        pass

    async def _weight_dtype(self) -> str:
        return "bfloat16"

    async def _receive_weights(self, version: int, interrupt: bool) -> dict[str, float]:
        self.version = version
        return {}

    async def _ping(self) -> int:
        if self.killed:
            raise ActorDiedError()
        return self.version

    async def _close(self) -> None:
        pass


class FakeTrainer:
    def __init__(self) -> None:
        self.pushes = 0
        for m in ("address", "push_backend", "join_push_group", "push_weights"):
            setattr(self, m, _Method(getattr(self, f"_{m}")))

    async def _address(self) -> tuple[str, int]:
        return "127.0.0.1", 1

    async def _push_backend(self) -> str:
        return "gloo"

    async def _join_push_group(self, *args: Any) -> None:
        pass

    async def _push_weights(self, dtype: str) -> dict[str, float]:
        assert dtype == "bfloat16"  # what the workers' engines hold
        self.pushes += 1
        return {"sync/bytes": 1.0}


def _pool(made: list[FakeWorker], fail_restarts: bool = False) -> RolloutPool:
    def make(i: int) -> FakeWorker:
        worker = FakeWorker(f"w{len(made)}", start_fails=fail_restarts and len(made) > 0)
        made.append(worker)
        return worker

    return RolloutPool(make, 1, [FakeTrainer()], restart_timeout_s=5, push_timeout_s=5)


async def test_a_dead_workers_request_is_served_by_its_replacement_after_the_weights() -> None:
    made: list[FakeWorker] = []
    pool = _pool(made)
    await pool.start()
    made[0].release.clear()
    request = asyncio.create_task(pool.generate([1, 2], SamplingParams(), session_id="ep#0"))
    await asyncio.sleep(0.01)
    made[0].killed = True
    made[0].release.set()
    async with asyncio.timeout(5):
        while not pool.replicas[0].needs_weights:
            await asyncio.sleep(0.01)
    assert len(made) == 2 and not request.done()  # replaced, but it has no weights yet
    assert not pool.replicas[0].ready.is_set() and pool.replicas[0].needs_weights

    async def batch() -> Completion:  # the trainer waits for rollouts: serve() pushes meanwhile
        return await request

    out = await asyncio.wait_for(pool.serve(batch(), version=4), 5)
    assert out.token_ids == (2,) and out.versions == (4,)  # "w1", on the pushed weights
    assert pool.restarts == 1 and pool.trainers[0].pushes == 1
    stats = await pool.push(5)
    assert stats["rollout/worker_restarts"] == 1 and made[1].version == 5
    await pool.close()


async def test_a_replacement_that_cannot_start_stops_the_run() -> None:
    made: list[FakeWorker] = []
    pool = _pool(made, fail_restarts=True)
    await pool.start()
    made[0].killed = True
    request = asyncio.create_task(pool.generate([1], SamplingParams()))

    async def batch() -> Completion:
        return await request

    with pytest.raises(InferenceError, match=r"could not be restarted.*no GPU left"):
        await asyncio.wait_for(pool.serve(batch(), version=1), 5)
    with pytest.raises(InferenceError, match="no rollout worker can serve"):
        await pool.generate([1], SamplingParams())
    await pool.close()
