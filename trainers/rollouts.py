"""Where each step's batch comes from, by ``trainer.mode``: sync, one step ahead, or streamed.

All three play episodes with :func:`agentloop.collect.collect` (the one rollout loop; over
``rollout.loop_workers`` processes with :mod:`agentloop.loop_workers`) and hand
the recipe a list of groups per step; the recipe trains on it the same way whatever the mode.

- ``sync``: the step's batch is generated, then trained on (DAPO: generation rounds until
  ``prompts_per_step`` informative groups).
- ``one_step``: as soon as step t's batch is handed over, step t+1's is started with the same
  code, so it is generated while step t trains; the weight push after step t interrupts it and
  its episodes finish on the new weights (partial rollouts).
- ``async``: a :class:`~agentloop.trainers.stream.RolloutStream` plays groups continuously
  under the staleness bound; the trainer takes ``prompts_per_step`` of them per step.

A checkpoint stores the sampler where the trained batches left it plus, in async mode, the
stream's unconsumed groups; after a resume a one_step run generates its prefetched batch again
(same prompts, same seeds) and an async run first trains the saved groups and replays the saved
running tasks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agentloop.collect import stable_seed
from agentloop.engines.base import Engine, SamplingParams, generate
from agentloop.errors import AgentLoopError
from agentloop.loop_workers import Collector
from agentloop.trainers.config_data import AlgorithmConfig, TrainRolloutConfig
from agentloop.trainers.config_infra import TrainerConfig
from agentloop.trainers.dapo import accumulate_groups, apply_overlong_penalty
from agentloop.trainers.data import PromptSampler, read_step_groups
from agentloop.trainers.stream import RolloutStream, StreamSettings
from agentloop.types import Completion, Task, TrajectoryGroup

if TYPE_CHECKING:
    from agentloop.trainers.config import TrainConfig

__all__ = [
    "BatchSource",
    "BusyMeter",
    "GenContext",
    "SourceState",
    "generate_batch",
    "make_source",
    "version_metrics",
]

Batch = tuple[list[TrajectoryGroup], dict[str, float]]


@dataclass(frozen=True)
class GenContext:
    """What generation needs from a run: three sections of its config, the loop, the tasks."""

    rollout: TrainRolloutConfig
    algorithm: AlgorithmConfig
    trainer: TrainerConfig
    collect: Collector | None
    """``collect`` bound to the run's engine, env (``data.env`` with ``data.tools``) and
    builder, over ``rollout.loop_workers`` processes; None when the run generates nothing."""
    sampler: PromptSampler

    @classmethod
    def of(cls, cfg: TrainConfig, collect: Collector | None, sampler: PromptSampler) -> GenContext:
        """The context of a run configured by ``cfg``."""
        return cls(cfg.rollout, cfg.algorithm, cfg.trainer, collect, sampler)


@dataclass(frozen=True)
class SourceState:
    """What a checkpoint saves so that a resumed run continues the data order."""

    sampler: Mapping[str, int]
    """:meth:`PromptSampler.state_dict` where the trained batches left it."""
    rollout_buffer: Mapping[str, Any] | None = None
    """Async mode: the stream's finished, unconsumed groups and its running tasks
    (:meth:`RolloutStream.state_dict`)."""


class BatchSource(Protocol):
    """A step's batch, whatever the mode (see the module docstring)."""

    async def next_batch(self, step: int) -> Batch: ...

    def pushed(self, version: int) -> None:
        """The engines now hold the weights of policy ``version``."""

    def state(self) -> SourceState:
        """What a checkpoint saves so that a resumed run continues the data order."""

    async def aclose(self) -> None: ...


async def _play(ctx: GenContext, tasks: Sequence[Task], seed: int) -> list[TrajectoryGroup]:
    alg = ctx.algorithm
    assert ctx.collect is not None
    groups = await ctx.collect(
        tasks,
        group_size=ctx.rollout.n,
        concurrency=ctx.rollout.concurrency,
        seed=seed,
    )
    if alg.overlong_buffer:
        groups = apply_overlong_penalty(
            groups,
            max_response_len=ctx.rollout.max_response_len,
            overlong_buffer=alg.overlong_buffer,
            penalty_factor=alg.overlong_penalty_factor,
        )
    return groups


async def generate_batch(ctx: GenContext, step: int) -> Batch:
    """This step's groups: replayed from disk, or collected (and, with DAPO dynamic sampling,
    collected again until ``prompts_per_step`` groups have non-constant rewards)."""
    alg = ctx.algorithm
    if ctx.rollout.replay is not None:
        return read_step_groups(ctx.rollout.replay, step), {"rollout/gen_rounds": 0.0}
    buffer: list[TrajectoryGroup] = []
    dropped, sampled_tokens, rounds = 0, 0, 0
    while True:
        rounds += 1
        tasks = ctx.sampler.next_batch(ctx.trainer.prompts_per_step)
        groups = await _play(ctx, tasks, stable_seed(ctx.trainer.seed, step, rounds))
        sampled_tokens += sum(t.num_trained_tokens for g in groups for t in g.trajectories)
        if not alg.dynamic_sampling:
            batch: list[TrajectoryGroup] | None = groups
        else:
            batch, buffer, stats = accumulate_groups(
                buffer,
                groups,
                target_groups=ctx.trainer.prompts_per_step,
                rounds=rounds,
                max_rounds=alg.max_sampling_rounds,
                metric=alg.filter_metric,
            )
            dropped += stats.dropped_groups
        if batch is not None:
            return batch, {
                "rollout/gen_rounds": float(rounds),
                "rollout/dropped_groups": float(dropped),
                "perf/sampled_tokens": float(sampled_tokens),
            }


class _SyncSource:
    def __init__(self, ctx: GenContext) -> None:
        self.ctx = ctx

    async def next_batch(self, step: int) -> Batch:
        return await generate_batch(self.ctx, step)

    def pushed(self, version: int) -> None:
        pass

    def state(self) -> SourceState:
        return SourceState(self.ctx.sampler.state_dict())

    async def aclose(self) -> None:
        pass


class _OneStepSource(_SyncSource):
    """Step t+1's batch is started when step t's is handed over."""

    def __init__(self, ctx: GenContext) -> None:
        super().__init__(ctx)
        self._ahead: tuple[int, asyncio.Task[Batch], dict[str, int]] | None = None

    async def next_batch(self, step: int) -> Batch:
        if self._ahead is not None and self._ahead[0] == step:
            t0 = time.perf_counter()
            try:
                async with asyncio.timeout(self.ctx.trainer.batch_timeout_s):
                    groups, metrics = await self._ahead[1]
            except TimeoutError:
                raise AgentLoopError(
                    f"step {step}'s batch was not generated within trainer.batch_timeout_s="
                    f"{self.ctx.trainer.batch_timeout_s} s; check the engines"
                ) from None
            metrics = {**metrics, "async/wait_s": time.perf_counter() - t0}
        else:
            groups, metrics = await generate_batch(self.ctx, step)
        self._ahead = None  # handed over: a checkpoint from now on must not generate it again
        if step < self.ctx.trainer.total_steps:
            before = self.ctx.sampler.state_dict()
            job = asyncio.create_task(generate_batch(self.ctx, step + 1), name=f"batch-{step + 1}")
            self._ahead = (step + 1, job, before)
        return groups, metrics

    def state(self) -> SourceState:
        # the batch being generated is generated again after a resume (same prompts and seeds)
        return SourceState(self._ahead[2] if self._ahead else self.ctx.sampler.state_dict())

    async def aclose(self) -> None:
        if self._ahead is not None:
            self._ahead[1].cancel()
            await asyncio.wait([self._ahead[1]], timeout=60)


class _AsyncSource(_SyncSource):
    """Groups streamed by a :class:`RolloutStream` beside the trainer."""

    def __init__(self, ctx: GenContext, start: int, buffer: Mapping[str, Any] | None) -> None:
        super().__init__(ctx)
        t, alg = ctx.trainer, ctx.algorithm
        settings = StreamSettings(
            groups_per_batch=t.prompts_per_step,
            max_staleness=t.max_staleness,
            policy=t.staleness_policy,
            max_groups_in_flight=max(1, ctx.rollout.concurrency // ctx.rollout.n),
            timeout_s=t.batch_timeout_s,
            dynamic_sampling=alg.dynamic_sampling,
            filter_metric=alg.filter_metric,
            max_dropped_per_batch=alg.max_sampling_rounds * t.prompts_per_step,
        )
        self.stream = RolloutStream(
            settings,
            next_task=lambda: ctx.sampler.next_batch(1)[0],
            play=self._play_group,
            version=start,
            consumed=start * t.prompts_per_step,
        )
        if buffer:
            self.stream.load_state_dict(dict(buffer))

    async def _play_group(self, task: Task, index: int) -> TrajectoryGroup:
        seed = stable_seed(self.ctx.trainer.seed, -1, index)
        return (await _play(self.ctx, [task], seed))[0]

    async def next_batch(self, step: int) -> Batch:
        batch = await self.stream.take(trainer_version=step - 1)
        tokens = sum(t.num_trained_tokens for g in batch.groups for t in g.trajectories)
        return list(batch.groups), {**batch.metrics, "perf/sampled_tokens": float(tokens)}

    def pushed(self, version: int) -> None:
        self.stream.set_version(version)

    def state(self) -> SourceState:
        return SourceState(self.ctx.sampler.state_dict(), self.stream.state_dict())

    async def aclose(self) -> None:
        await self.stream.close()


def make_source(ctx: GenContext, *, start: int, state: SourceState | None = None) -> BatchSource:
    """The batch source of ``ctx.trainer.mode`` for a run that has trained ``start`` steps,
    continuing from a checkpoint's ``state`` (the sampler's position, async mode's buffer)."""
    if state is not None:
        ctx.sampler.load_state_dict(dict(state.sampler))
    mode = ctx.trainer.mode
    if mode == "one_step":
        return _OneStepSource(ctx)
    if mode == "async":
        return _AsyncSource(ctx, start, state.rollout_buffer if state else None)
    return _SyncSource(ctx)


def version_metrics(groups: Sequence[TrajectoryGroup], trainer_version: int) -> dict[str, float]:
    """``async/*`` staleness of a batch trained by ``trainer_version``: over trained tokens,
    the mean and max of ``trainer_version - token version`` and the oldest/newest version; the
    share of trajectories whose tokens span several versions (sampled across a weight push)."""
    trajs = [t for g in groups for t in g.trajectories if t.trained_versions]
    if not trajs:
        return {}
    lags = [trainer_version - v for t in trajs for v in t.trained_versions]
    return {
        "async/staleness_mean": sum(lags) / len(lags),
        "async/staleness_max": float(max(lags)),
        "async/version_min": float(trainer_version - max(lags)),
        "async/version_max": float(trainer_version - min(lags)),
        "async/multi_version_frac": sum(len(set(t.trained_versions)) > 1 for t in trajs)
        / len(trajs),
    }


class BusyMeter:
    """The Engine ``engine``, measuring the time with a request in flight (for
    ``perf/rollout_idle_frac``). It only generates: weight syncs, sleep and wake go to the
    worker group's engine itself."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._in_flight = 0
        self._busy_s = 0.0
        self._since = 0.0

    def busy_s(self) -> float:
        """Seconds so far with at least one request in flight."""
        open_s = time.perf_counter() - self._since if self._in_flight else 0.0
        return self._busy_s + open_s

    @property
    def supports_images(self) -> bool:
        return self.engine.supports_images

    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[Any] = (),
    ) -> Completion:
        if self._in_flight == 0:
            self._since = time.perf_counter()
        self._in_flight += 1
        try:
            return await generate(
                self.engine, prompt_ids, sampling, session_id=session_id, images=images
            )
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._busy_s += time.perf_counter() - self._since
