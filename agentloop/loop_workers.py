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
dies fails the batch with its exit code (no hang, nothing dropped), and so does one that dies or
cannot start while the pool starts. This process enforces the episodes' deadlines: a worker that
has not returned an episode within ``rollout.timeout_s`` plus ``grace_s`` (its own loop ends every
episode at ``timeout_s``, so it is stopped, hung, or stuck in a C extension holding the GIL) is
killed and fails the batch naming its pid and the episode, as a dead one does. The batch fails
rather than replaying the worker's episodes elsewhere: whatever hung it (a deadlock, a tool that
never returns) would likely hang the replay too, and a replay would run tools with side effects
twice; a failed run says so and exits non-zero. Closing the pool stops every worker, and a
worker whose parent is gone exits on its own (the socket closes).

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
import itertools
import multiprocessing
import multiprocessing.process
import os
import pickle
import socket
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentloop.chat import TokenBuilder
from agentloop.collect import (
    EnvFactory,
    collect,
    gather_groups,
    resolve_env,
)
from agentloop.engines.base import Engine, generate
from agentloop.errors import AgentLoopError, ConfigError, InferenceError
from agentloop.loop_wire import (
    Broken,
    Cancel,
    Channel,
    Generate,
    Generated,
    Play,
    Played,
    Ready,
    Start,
    open_channel,
)
from agentloop.loop_worker import Setup, worker_main
from agentloop.rollout import RolloutConfig, check_builder
from agentloop.types import Task, Trajectory, TrajectoryGroup

__all__ = ["Collector", "LoopWorkers", "batch_collector"]

_STOP_S = 10.0  # a worker asked to stop gets this long before it is killed
GRACE_S = 30.0  # past rollout.timeout_s, how long a worker may take to return an episode
START_S = 300.0  # how long the workers may take to start (each imports transformers)


@dataclass(eq=False)
class _Worker:
    process: multiprocessing.process.BaseProcess
    channel: Channel
    ready: asyncio.Future[None]
    jobs: dict[int, asyncio.Future[list[Trajectory]]] = field(default_factory=dict)
    reader: asyncio.Task[None] | None = None
    failure: AgentLoopError | None = None  # why it was killed (hung), or could not start

    def gone(self) -> AgentLoopError:
        if self.failure is not None:
            return self.failure
        when = "" if self.ready.done() else " while starting"
        return AgentLoopError(
            f"loop worker {self.process.pid} exited (exit code {self.process.exitcode}){when} "
            f"with {len(self.jobs)} episodes unfinished; its output above says why. "
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
        grace_s: float = GRACE_S,
        start_timeout_s: float = START_S,
    ) -> None:
        if workers < 1:
            raise ConfigError(f"loop_workers must be >= 1, got {workers}")
        if grace_s < 0 or start_timeout_s <= 0:
            raise ConfigError(
                f"LoopWorkers needs grace_s >= 0 and start_timeout_s > 0, got {grace_s}, "
                f"{start_timeout_s}"
            )
        check_builder(builder, config)
        resolve_env(env, env_kwargs or {}, builder)  # an unknown id or bad kwargs fail here
        self._engine, self._count = engine, workers
        self._grace_s, self._start_timeout_s = grace_s, start_timeout_s
        self._setup = Setup(env, dict(env_kwargs or {}), builder, config, engine.supports_images)
        self._workers: list[_Worker] = []
        self._jobs = itertools.count()
        self._requests: set[asyncio.Task[None]] = set()
        self._failed: AgentLoopError | None = None  # a worker died: every batch from then on
        self._closing = False

    async def __aenter__(self) -> LoopWorkers:
        _check_main_script()
        setup = self._pickled_setup()
        # side by side: each worker imports transformers and builds the TokenBuilder again
        spawned = await asyncio.gather(
            *(self._spawn(setup) for _ in range(self._count)), return_exceptions=True
        )
        self._workers = [w for w in spawned if isinstance(w, _Worker)]
        try:
            for failed in spawned:
                if isinstance(failed, BaseException):
                    raise failed
            await self._started()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def _started(self) -> None:
        """Wait for every worker's ``Ready``: the first that dies or cannot start fails it."""
        try:
            async with asyncio.timeout(self._start_timeout_s):
                await asyncio.gather(*(w.ready for w in self._workers))
        except TimeoutError:
            late = [w.process.pid for w in self._workers if not w.ready.done()]
            raise AgentLoopError(
                f"loop workers {late} did not start within {self._start_timeout_s:g} s (each "
                "imports the env's modules and transformers); a loaded machine may need a "
                "larger start_timeout_s, or run with loop_workers=1"
            ) from None

    def _pickled_setup(self) -> bytes:
        try:
            return pickle.dumps(self._setup, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise ConfigError(
                f"loop workers are spawned processes, and the env {self._setup.env!r} (or the "
                f"TokenBuilder) could not be sent to them ({exc}); pass a registered env id or a "
                "factory defined at the top level of an importable module, or set loop_workers=1"
            ) from exc

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(w.process.pid for w in self._workers if w.process.pid is not None)

    async def _spawn(self, setup: bytes) -> _Worker:
        ours, theirs = socket.socketpair()
        # the setup goes over the socket, not as an argument: spawn writes arguments into a pipe
        # that blocks for good when the child dies before reading them (a main script it cannot
        # re-import), and a child that dies now closes the socket, which fails the start
        process = multiprocessing.get_context("spawn").Process(
            target=worker_main, args=(theirs,), name="agentloop-loop", daemon=True
        )
        try:
            await asyncio.to_thread(process.start)
        finally:
            theirs.close()
        ready = asyncio.get_running_loop().create_future()
        worker = _Worker(process, await open_channel(ours), ready)
        worker.channel.send(Start(setup))
        worker.reader = asyncio.create_task(self._read(worker), name=f"loop-worker-{process.pid}")
        # its exit ends the reader even if a descendant keeps the socket open
        asyncio.get_running_loop().add_reader(process.sentinel, self._exited, worker)
        return worker

    def _exited(self, worker: _Worker) -> None:
        asyncio.get_running_loop().remove_reader(worker.process.sentinel)
        worker.channel.close()

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
                elif isinstance(message, Broken):
                    worker.failure = ConfigError(
                        f"loop worker {worker.process.pid} could not start: {message.reason}; "
                        "a spawned worker imports the env factory and its tools anew, so they "
                        "must be importable (a module, or the main script's top level under "
                        "`if __name__ == '__main__'`), or set loop_workers=1"
                    )
                    worker.ready.set_exception(worker.failure)
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
        done: asyncio.Future[list[Trajectory]] = asyncio.get_running_loop().create_future()
        worker.jobs[job] = done
        worker.channel.send(Play(job, task, index, seed))
        try:
            async with asyncio.timeout(self._setup.config.timeout_s + self._grace_s):
                return await done
        except TimeoutError:
            worker.jobs.pop(job, None)
            raise self._hung(worker, task, index) from None
        except asyncio.CancelledError:
            if worker.jobs.pop(job, None) is not None:
                worker.channel.send(Cancel(job))
            raise

    def _hung(self, worker: _Worker, task: Task, index: int) -> AgentLoopError:
        """Kill ``worker``, late with an episode, and fail it (and the pool) like a dead one."""
        if worker.failure is None:
            worker.failure = AgentLoopError(
                f"loop worker {worker.process.pid} did not return episode {task.id!r} (sample "
                f"{index}) within rollout.timeout_s={self._setup.config.timeout_s:g} s + "
                f"{self._grace_s:g} s of grace: the worker is stopped, hung or stuck (a "
                "deadlock, a C extension holding the GIL), so it was killed with "
                f"{len(worker.jobs) + 1} episodes unfinished. Run with loop_workers=1 to play "
                "the episodes in this process."
            )
            if worker.process.is_alive():
                worker.process.kill()
        if not self._closing:
            self._failed = self._failed or worker.failure
        return worker.failure

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
            asyncio.get_running_loop().remove_reader(worker.process.sentinel)
            await asyncio.to_thread(worker.process.join, _STOP_S)
            if worker.process.is_alive():
                worker.process.kill()
                await asyncio.to_thread(worker.process.join)
            if worker.reader is not None:
                await asyncio.wait([worker.reader])


def _check_main_script() -> None:
    """A ``ConfigError`` if spawned workers cannot start here: spawn re-runs the main script
    from its file first, and a script fed on stdin has none (every worker would die at once)."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return  # python -m module: re-imported by name
    path = getattr(main, "__file__", None)
    where = getattr(multiprocessing.process, "ORIGINAL_DIR", None) or ""
    if path is not None and not os.path.isfile(os.path.join(where, path)):
        raise ConfigError(
            f"loop workers are spawned processes that start by re-running the main script, "
            f"and this one is not a file ({path!r}: a script fed on stdin); save it to a file "
            "and run that, or set loop_workers=1"
        )


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
