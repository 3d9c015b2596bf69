"""Disaggregated placement: rollout workers apart from the trainers, and their restarts.

Each :class:`RolloutWorker` (a Ray actor in its own placement bundle) owns one vLLM engine. The
driver reaches them through :class:`RolloutPool`, an Engine that routes each request to a
serving worker (sticky per episode). Weights go from trainer rank 0 to the workers over a push
group (``trainers/weight_push.py``) formed anew for every push, so its members can change.

A worker that dies (its requests fail with a Ray actor error) is replaced by a new actor in the
same bundle; the requests it was running are sent again, to another serving worker or to the
replacement once it serves, so episodes go on and no tool call is repeated. The replacement
serves only after it has the trainer's weights: the trainer pushes them as soon as it is idle
(:meth:`RolloutPool.serve` wraps the trainer's wait for a batch) or at its next regular push.
Every wait is bounded: ``ray.restart_timeout_s`` for a worker to serve again,
``ray.weight_push_timeout_s`` for a push.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentloop.engines.base import SamplingParams, TrainEngine, generate
from agentloop.errors import InferenceError
from agentloop.types import Completion

__all__ = ["RolloutPool", "RolloutWorker"]

log = logging.getLogger(__name__)
R = TypeVar("R")
_PING_TIMEOUT_S = 30.0


class RolloutWorker:
    """One vLLM engine in its own actor, fed with weights over a push group."""

    def __init__(self, model_dir: str, engine: dict[str, Any]) -> None:
        self.model_dir, self.settings = model_dir, engine
        self.engine: TrainEngine | None = None
        self._push: Any = None

    async def start(self) -> tuple[int, ...]:
        from agentloop.engines.backends import start_train_engine

        self.engine = await start_train_engine(self.model_dir, self.settings)
        return self.engine.pids

    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        session_id: str | None = None,
        images: Sequence[Any] = (),
    ) -> Completion:
        return await generate(
            self._engine(), prompt_ids, sampling, session_id=session_id, images=images
        )

    async def join_push_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float
    ) -> None:
        from agentloop.trainers.weight_push import open_push_group

        self._push = await asyncio.to_thread(
            open_push_group, host, port, rank, world_size, backend=backend, timeout_s=timeout_s
        )

    async def receive_weights(self, version: int, interrupt: bool) -> dict[str, float]:
        """Receive one push and load it into the engine as policy ``version``, bucket by
        bucket as it arrives (the engine's chunks bound the memory, not the model's size)."""
        from agentloop.trainers.weight_push import stream

        push, self._push = self._push, None
        received = stream(push.receive(), asyncio.to_thread)
        try:
            stats = await self._engine().update_weights(
                received, version=version, interrupt=interrupt
            )
        finally:
            await received.aclose()  # a failed load still receives the rest of the push
        return {"sync/engine_load_s": stats.load_s, "sync/tensors": float(stats.num_tensors)}

    async def weight_dtype(self) -> str:
        """The engine's weight dtype (``dtype: auto`` resolved), e.g. ``"bfloat16"``: what the
        trainer gathers and pushes in."""
        return str(self._engine().weight_dtype).removeprefix("torch.")

    def ping(self) -> int:
        return 0 if self.engine is None else int(self.engine.version)

    def _engine(self) -> TrainEngine:
        if self.engine is None:
            raise InferenceError("this rollout worker's engine is not started (or was closed)")
        return self.engine

    async def close(self) -> None:
        if self.engine is not None:
            engine, self.engine = self.engine, None
            await engine.shutdown()


@dataclass
class _Replica:
    index: int
    actor: Any
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    incarnation: int = 0
    needs_weights: bool = False


class RolloutPool:
    """The Engine over ``num`` rollout workers; see the module docstring. ``make_actor(i)``
    creates worker ``i``'s actor (in its bundle), ``trainers`` are the trainer actors (rank 0
    hosts the pushes); each push is gathered in the engines' weight dtype, which a worker
    reports."""

    def __init__(
        self,
        make_actor: Callable[[int], Any],
        num: int,
        trainers: Sequence[Any],
        *,
        restart_timeout_s: float = 600.0,
        push_timeout_s: float = 300.0,
        supports_images: bool = False,
    ) -> None:
        self._make, self.trainers = make_actor, list(trainers)
        self._supports_images = supports_images  # the workers serve a vision-language model
        self.restart_timeout_s, self.push_timeout_s = restart_timeout_s, push_timeout_s
        self.replicas = [_Replica(i, None) for i in range(num)]
        self.restarts = 0
        self._sessions: dict[str, int] = {}
        self._changed = asyncio.Event()
        self._needs_weights = asyncio.Event()
        self._failed = asyncio.Event()  # a worker could not be restarted: the run must stop
        self._tasks: set[asyncio.Task[None]] = set()
        self._error: BaseException | None = None

    @property
    def supports_images(self) -> bool:
        return self._supports_images

    @property
    def actors(self) -> list[Any]:
        return [r.actor for r in self.replicas]

    async def start(self) -> None:
        """Create the workers and start their engines (they serve the model dir: version 0)."""
        for r in self.replicas:
            r.actor = self._make(r.index)
        await self._deadline(
            asyncio.gather(*(r.actor.start.remote() for r in self.replicas)),
            self.restart_timeout_s,
            "start the rollout workers",
        )
        for r in self.replicas:
            r.ready.set()

    # ------------------------------------------------------------------ generation
    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[Any] = (),
    ) -> Completion:
        from ray.exceptions import RayActorError

        while True:
            r = await self._pick(session_id)
            incarnation = r.incarnation
            r.in_flight += 1
            try:
                result: Completion = await r.actor.generate.remote(
                    list(prompt_ids), sampling, session_id, tuple(images)
                )
                return result
            except RayActorError as exc:  # the worker died: send the request again
                log.warning("rollout worker %d died (%s); resending its request", r.index, exc)
                self._died(r, incarnation)
            finally:
                r.in_flight -= 1

    async def _pick(self, session_id: str | None) -> _Replica:
        """A serving replica: the session's own if it serves, else the least busy one."""
        try:
            async with asyncio.timeout(self.restart_timeout_s):
                while True:
                    if self._error is not None:
                        raise InferenceError(f"no rollout worker can serve: {self._error}")
                    serving = [r for r in self.replicas if r.ready.is_set()]
                    if serving:
                        break
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise InferenceError(
                f"no rollout worker served for ray.restart_timeout_s={self.restart_timeout_s} s"
            ) from None
        own = self._sessions.get(session_id) if session_id is not None else None
        if own is not None and self.replicas[own].ready.is_set():
            return self.replicas[own]
        r = min(serving, key=lambda x: x.in_flight)
        if session_id is not None:
            self._sessions[session_id] = r.index
        return r

    def _died(self, r: _Replica, incarnation: int) -> None:
        if r.incarnation != incarnation:
            return  # already being replaced
        r.ready.clear()
        r.needs_weights = False
        r.incarnation += 1
        self._spawn(self._restart(r))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restart(self, r: _Replica) -> None:
        import ray

        if ray.is_initialized():  # never start a Ray instance just to kill something
            with contextlib.suppress(Exception):
                ray.kill(r.actor)
        try:
            r.actor = self._make(r.index)
            await self._deadline(
                r.actor.start.remote(), self.restart_timeout_s, f"restart rollout worker {r.index}"
            )
        except Exception as exc:  # recorded: serve() stops the run, generate() fails fast
            log.error("rollout worker %d could not be restarted: %s", r.index, exc)
            self._error = exc
            self._failed.set()
            self._changed.set()
            return
        self.restarts += 1
        r.needs_weights = True  # it serves once the trainer has pushed its weights to it
        self._needs_weights.set()
        log.warning("rollout worker %d restarted; waiting for the trainer's weights", r.index)

    # ------------------------------------------------------------------ weights
    async def push(
        self, version: int, *, interrupt: bool = False, only_new: bool = False
    ) -> dict[str, float]:
        """Push the trainer's weights as policy ``version`` to every live worker (``only_new``:
        to the restarted ones only). A worker that dies meanwhile is restarted; the push is
        made again to the others."""
        for attempt in (1, 2):
            targets = [
                r for r in self.replicas if r.needs_weights or (r.ready.is_set() and not only_new)
            ]
            if not targets:
                return self._stats({})
            try:
                stats = await self._push(targets, version, interrupt)
            except Exception as exc:
                if attempt == 2:
                    raise InferenceError(
                        f"weight push to the rollout workers failed: {exc}"
                    ) from exc
                log.warning("weight push failed (%s); checking the rollout workers", exc)
                await self._check_alive(targets)
                continue
            for r in targets:
                if r.needs_weights:
                    r.needs_weights = False
                    r.ready.set()
            self._changed.set()
            return self._stats(stats)
        raise AssertionError("unreachable")

    async def _push(
        self, targets: list[_Replica], version: int, interrupt: bool
    ) -> dict[str, float]:
        rank0 = self.trainers[0]
        (host, port), backend, dtype = await self._together(
            [
                rank0.address.remote(),
                rank0.push_backend.remote(),
                targets[0].actor.weight_dtype.remote(),
            ],
            "reach trainer rank 0 and a rollout worker",
        )
        world = len(targets) + 1
        t0 = time.perf_counter()
        await self._together(
            [
                rank0.join_push_group.remote(host, port, world, self.push_timeout_s),
                *(
                    r.actor.join_push_group.remote(
                        host, port, i + 1, world, backend, self.push_timeout_s
                    )
                    for i, r in enumerate(targets)
                ),
            ],
            "form the weight push group",
        )
        results = await self._together(
            [
                *(t.push_weights.remote(dtype) for t in self.trainers),
                *(r.actor.receive_weights.remote(version, interrupt) for r in targets),
            ],
            "push the weights",
        )
        stats: dict[str, float] = {**results[len(self.trainers)], **results[0]}
        stats["sync/push_s"] = time.perf_counter() - t0
        return stats

    async def _together(self, calls: list[Any], what: str) -> list[Any]:
        """The results of ``calls`` (one phase of a push, on trainers and workers at once),
        within ``push_timeout_s``. When one fails (a dead worker fails at once), the others are
        waited for before the error is raised, each bounded by its own ``push_timeout_s``:
        trainer rank 0 left inside a half-formed group would hold its torch thread, and the
        next push (or training step) would queue behind it."""
        futures = [asyncio.ensure_future(c) for c in calls]
        try:
            return list(await self._deadline(asyncio.gather(*futures), self.push_timeout_s, what))
        except BaseException:
            await asyncio.wait(futures, timeout=self.push_timeout_s)
            raise

    async def _check_alive(self, targets: list[_Replica]) -> None:
        for r in targets:
            incarnation = r.incarnation
            try:
                await asyncio.wait_for(r.actor.ping.remote(), _PING_TIMEOUT_S)
            except Exception:
                self._died(r, incarnation)

    def _stats(self, stats: dict[str, float]) -> dict[str, float]:
        return {**stats, "rollout/worker_restarts": float(self.restarts)}

    async def serve(self, work: Awaitable[R], version: int) -> R:
        """Await ``work`` (the trainer's wait for a batch); meanwhile push the trainer's weights
        (policy ``version``) to each restarted worker, so that it serves the awaited batch."""
        job = asyncio.ensure_future(work)
        try:
            while True:
                waiters = {
                    asyncio.ensure_future(e.wait()) for e in (self._needs_weights, self._failed)
                }
                done, _ = await asyncio.wait({job, *waiters}, return_when=asyncio.FIRST_COMPLETED)
                for w in waiters:
                    w.cancel()
                if self._error is not None:
                    raise InferenceError(
                        f"a rollout worker could not be restarted, so the run stops: {self._error}"
                    ) from self._error
                if job in done:
                    return job.result()
                self._needs_weights.clear()
                await self.push(version, interrupt=True, only_new=True)
        finally:
            if not job.done():
                job.cancel()

    async def close(self) -> None:
        """Stop every worker's engine, then the actors."""
        import ray

        for task in list(self._tasks):
            task.cancel()
        actors = [r.actor for r in self.replicas if r.actor is not None]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                asyncio.gather(*(a.close.remote() for a in actors), return_exceptions=True), 120
            )
        for a in actors if ray.is_initialized() else ():
            with contextlib.suppress(Exception):
                ray.kill(a)

    @staticmethod
    async def _deadline(aw: Awaitable[R], timeout_s: float, what: str) -> R:
        try:
            return await asyncio.wait_for(aw, timeout_s)
        except TimeoutError:
            raise InferenceError(f"could not {what} within {timeout_s} s") from None
