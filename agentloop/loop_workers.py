"""LoopWorkers: play collect's episodes in worker processes against one engine in this process.

The rollout loop's own Python (template, tool-call parsing, tools, token accounting: ~150–220 µs
per turn) runs on one core under asyncio; with a thousand episodes in flight that core, not the
engine, sets the pace (docs/performance.md, "The rollout loop at scale"). ``LoopWorkers`` spawns
``workers`` processes that each run the same loop (:func:`agentloop.collect.play_one`) on a share
of the episodes. Every engine request comes back here, to the one engine (vLLM, a router, a
fake), over a socket pair (:mod:`agentloop.loop_wire`). This process keeps the engine's work and
the messages, about half the loop's cost per turn: 2–2.5× one process at best
(``bench/loop_workers_bench.py``, docs/performance.md).

Episodes are dealt one at a time to the worker with the fewest in flight, and their seeds are
those of :func:`agentloop.collect.collect` (run seed, task id, sample index), so the groups that
come back — reassembled here in task order — are the ones a single process plays. A worker that
dies fails the batch with its exit code (no hang, nothing dropped); closing the pool stops every
worker, and a worker whose parent is gone exits on its own (the socket closes).

The env is a registered id or a picklable factory (:class:`agentloop.eval.EnvMaker` is one):
the workers are spawned, not forked (the engine's threads make a fork unsafe), so a lambda or a
function defined inside another cannot reach them, and custom envs and tools must be importable
(a module, or the main script's top level under ``if __name__ == "__main__"``). Each worker
makes its own tools and sandboxes. Tool-call recording and replay (``tool_tape``) are this
process's, so they need ``loop_workers=1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import itertools
import multiprocessing
import pickle
import socket
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentloop.chat import TokenBuilder
from agentloop.collect import (
    YOUNG_GC_PER_EPISODE,
    EnvFactory,
    collect,
    gather_groups,
    play_one,
    resolve_env,
    rollout_gc,
)
from agentloop.engines.base import Engine, SamplingParams, generate
from agentloop.errors import AgentLoopError, ConfigError, InferenceError
from agentloop.loop_wire import (
    Cancel,
    Channel,
    Generate,
    Generated,
    Play,
    Played,
    Ready,
    open_channel,
)
from agentloop.rollout import RolloutConfig, check_builder
from agentloop.types import Completion, Task, Trajectory, TrajectoryGroup

__all__ = ["Collector", "LoopWorkers", "batch_collector"]

_STOP_S = 10.0  # a worker asked to stop gets this long before it is killed


@dataclass(frozen=True)
class _Setup:
    """What a worker is started with."""

    env: str | EnvFactory
    env_kwargs: Mapping[str, Any]
    builder: TokenBuilder
    config: RolloutConfig
    supports_images: bool


# -- the worker side -------------------------------------------------------------------------
class _EngineClient:
    """The Engine a worker's episodes see: each request is answered by the main process's."""

    def __init__(self, channel: Channel, supports_images: bool) -> None:
        self._channel, self._images = channel, supports_images
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future[Generated]] = {}

    @property
    def supports_images(self) -> bool:
        return self._images

    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[Any] = (),
    ) -> Completion:
        request = next(self._ids)
        answer = self._waiting[request] = asyncio.get_running_loop().create_future()
        self._channel.send(Generate(request, prompt_ids, sampling, session_id, tuple(images)))
        try:
            reply = await answer
        finally:
            self._waiting.pop(request, None)
        if reply.completion is None:
            raise reply.error or InferenceError("the engine returned nothing")
        return reply.completion

    def answer(self, reply: Generated) -> None:
        waiting = self._waiting.get(reply.request)
        if waiting is not None and not waiting.done():  # gone: its episode was cancelled
            waiting.set_result(reply)


def _worker_main(sock: socket.socket, setup: _Setup) -> None:
    """A worker process: play what the main process deals out until it stops or is gone."""
    asyncio.run(_work(sock, setup))


async def _work(sock: socket.socket, setup: _Setup) -> None:
    channel = await open_channel(sock)
    engine = _EngineClient(channel, setup.supports_images)
    factory = resolve_env(setup.env, setup.env_kwargs, setup.builder)
    running: dict[int, asyncio.Task[None]] = {}
    channel.send(Ready())

    async def play(message: Play) -> None:
        trajectories = await play_one(
            factory, engine, setup.builder, message.task, setup.config, message.index, message.seed
        )
        running.pop(message.job, None)
        channel.send(Played(message.job, trajectories))

    with rollout_gc(episodes=1):  # the heap frozen; young collections spaced as episodes arrive
        while True:
            try:
                messages = await channel.receive()
            except (asyncio.IncompleteReadError, ConnectionError):
                break  # the main process is gone
            for message in messages:
                if isinstance(message, Generated):
                    engine.answer(message)
                elif isinstance(message, Play):
                    running[message.job] = asyncio.create_task(play(message))
                    _space_young_collections(len(running))
                elif isinstance(message, Cancel) and message.job in running:
                    running.pop(message.job).cancel()
    channel.close()  # asyncio.run cancels what still runs, and each episode closes its env


def _space_young_collections(running: int) -> None:
    """Space young GC collections by the episodes this worker runs, as ``collect`` does for a
    batch (:func:`agentloop.collect.rollout_gc`); doubled when outgrown, never lowered."""
    young, *older = gc.get_threshold()
    wanted = YOUNG_GC_PER_EPISODE * running
    if 0 < young < wanted:
        gc.set_threshold(2 * wanted, *older)


# -- the main side ---------------------------------------------------------------------------
@dataclass(eq=False)
class _Worker:
    process: multiprocessing.process.BaseProcess
    channel: Channel
    ready: asyncio.Future[None]
    jobs: dict[int, asyncio.Future[list[Trajectory]]] = field(default_factory=dict)
    reader: asyncio.Task[None] | None = None

    def gone(self) -> AgentLoopError:
        return AgentLoopError(
            f"loop worker {self.process.pid} exited (exit code {self.process.exitcode}) with "
            f"{len(self.jobs)} episodes unfinished; its output above says why. "
            "Run with loop_workers=1 to play the episodes in this process."
        )


class LoopWorkers:
    """``workers`` processes playing episodes of ``env`` against ``engine``; an async context
    manager whose :meth:`collect` is :func:`agentloop.collect.collect` spread over them.

    >>> async with LoopWorkers(engine, "agentloop/Calc-v0", builder, config, workers=4) as pool:
    ...     groups = await pool.collect(tasks, group_size=8, concurrency=512)
    """

    def __init__(
        self,
        engine: Engine,
        env: str | EnvFactory,
        builder: TokenBuilder,
        config: RolloutConfig,
        *,
        workers: int,
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if workers < 1:
            raise ConfigError(f"loop_workers must be >= 1, got {workers}")
        check_builder(builder, config)
        resolve_env(env, env_kwargs or {}, builder)  # an unknown id or bad kwargs fail here
        self._engine, self._count = engine, workers
        self._setup = _Setup(env, dict(env_kwargs or {}), builder, config, engine.supports_images)
        self._workers: list[_Worker] = []
        self._jobs = itertools.count()
        self._requests: set[asyncio.Task[None]] = set()
        self._failed: AgentLoopError | None = None  # a worker died: every batch from then on
        self._closing = False

    async def __aenter__(self) -> LoopWorkers:
        # side by side: each worker imports transformers and builds the TokenBuilder again
        spawned = await asyncio.gather(
            *(self._spawn() for _ in range(self._count)), return_exceptions=True
        )
        self._workers = [w for w in spawned if isinstance(w, _Worker)]
        try:
            for failed in spawned:
                if isinstance(failed, BaseException):
                    raise failed
            await asyncio.gather(*(w.ready for w in self._workers))
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(w.process.pid for w in self._workers if w.process.pid is not None)

    async def _spawn(self) -> _Worker:
        ours, theirs = socket.socketpair()
        process = multiprocessing.get_context("spawn").Process(
            target=_worker_main, args=(theirs, self._setup), name="agentloop-loop", daemon=True
        )
        try:  # start() returns once the child has read its arguments, after its imports
            await asyncio.to_thread(process.start)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            ours.close()
            raise ConfigError(
                f"loop workers are spawned processes, and the env {self._setup.env!r} (or the "
                f"TokenBuilder) could not be sent to them ({exc}); pass a registered env id or a "
                "factory defined at the top level of an importable module, or set loop_workers=1"
            ) from exc
        finally:
            theirs.close()
        ready = asyncio.get_running_loop().create_future()
        worker = _Worker(process, await open_channel(ours), ready)
        worker.reader = asyncio.create_task(self._read(worker), name=f"loop-worker-{process.pid}")
        return worker

    async def _read(self, worker: _Worker) -> None:
        while True:
            try:
                messages = await worker.channel.receive()
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            for message in messages:
                if isinstance(message, Generate):
                    request = asyncio.create_task(self._generate(worker, message))
                    self._requests.add(request)
                    request.add_done_callback(self._requests.discard)
                elif isinstance(message, Ready):
                    worker.ready.set_result(None)
                elif isinstance(message, Played):
                    done = worker.jobs.pop(message.job, None)
                    if done is not None and not done.done():
                        done.set_result(message.trajectories)
        await asyncio.to_thread(worker.process.join, _STOP_S)  # its exit code, for the error
        error = worker.gone()
        if not self._closing:
            self._failed = self._failed or error
        waiting: list[asyncio.Future[Any]] = [worker.ready, *worker.jobs.values()]
        for future in waiting:
            if not future.done():
                future.set_exception(error)

    async def _generate(self, worker: _Worker, message: Generate) -> None:
        try:
            completion = await generate(
                self._engine,
                message.prompt_ids,
                message.sampling,
                session_id=message.session_id,
                images=message.images,
            )
        except Exception as exc:  # the worker's episode records it, as with a local engine
            error = (
                exc
                if isinstance(exc, InferenceError)
                else InferenceError(f"{type(exc).__name__}: {exc}")
            )
            worker.channel.send(Generated(message.request, None, error))
        else:
            worker.channel.send(Generated(message.request, completion))

    async def _play(self, task: Task, index: int, seed: int) -> list[Trajectory]:
        if self._failed is not None:
            raise self._failed
        worker = min(self._workers, key=lambda w: len(w.jobs))
        job = next(self._jobs)
        done = worker.jobs[job] = asyncio.get_running_loop().create_future()
        worker.channel.send(Play(job, task, index, seed))
        try:
            return await done
        except asyncio.CancelledError:
            if worker.jobs.pop(job, None) is not None:
                worker.channel.send(Cancel(job))
            raise

    async def collect(
        self,
        tasks: Sequence[Task],
        *,
        group_size: int = 1,
        concurrency: int = 64,
        seed: int = 0,
        on_trajectory: Callable[[Trajectory], None] | None = None,
    ) -> list[TrajectoryGroup]:
        """:func:`agentloop.collect.collect` of the pool's env, engine and builder: the same
        groups, in task order, with the episodes played by the workers."""
        if not self._workers:
            raise AgentLoopError("LoopWorkers.collect needs the pool started: `async with` it")
        return await gather_groups(tasks, self._play, group_size, concurrency, seed, on_trajectory)

    async def aclose(self) -> None:
        """Stop every worker: the socket closes, each exits, stragglers are killed."""
        workers, self._workers = self._workers, []
        self._closing = True
        for worker in workers:
            worker.channel.close()
        for worker in workers:
            await asyncio.to_thread(worker.process.join, _STOP_S)
            if worker.process.is_alive():
                worker.process.kill()
                await asyncio.to_thread(worker.process.join)
            if worker.reader is not None:
                await asyncio.wait([worker.reader])


class Collector(Protocol):
    """``collect`` with its env, engine, builder and rollout config bound."""

    async def __call__(
        self,
        tasks: Sequence[Task],
        *,
        group_size: int = ...,
        concurrency: int = ...,
        seed: int = ...,
        on_trajectory: Callable[[Trajectory], None] | None = ...,
    ) -> list[TrajectoryGroup]: ...


@contextlib.asynccontextmanager
async def batch_collector(
    engine: Engine,
    env: str | EnvFactory,
    builder: TokenBuilder,
    config: RolloutConfig,
    *,
    workers: int = 1,
    env_kwargs: Mapping[str, Any] | None = None,
) -> AsyncIterator[Collector]:
    """:func:`agentloop.collect.collect` bound to ``engine``, ``env``, ``builder`` and ``config``:
    played in this process (``workers=1``) or spread over ``workers`` processes
    (:class:`LoopWorkers`, started here and stopped on exit)."""
    if workers == 1:
        yield functools.partial(
            collect, env=env, engine=engine, builder=builder, config=config, env_kwargs=env_kwargs
        )
        return
    async with LoopWorkers(
        engine, env, builder, config, workers=workers, env_kwargs=env_kwargs
    ) as pool:
        yield pool.collect
