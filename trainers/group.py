"""WorkerGroup: the driver's handle on the colocated workers — one in-process, or N Ray actors.

The recipe sees one object whatever the placement: it hands whole batches to
:meth:`WorkerGroup.compute_logprobs` and :meth:`WorkerGroup.train_step`, which split them over
the data-parallel ranks (balanced by workload) and put the results back in order; rollouts go
through :attr:`WorkerGroup.engine` (the one engine, or the router over every worker's engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from agentloop.engines.base import Engine
from agentloop.errors import ConfigError
from agentloop.trainers.colocated import ColocatedWorker, WorkerSpec
from agentloop.trainers.config import TrainConfig
from agentloop.trainers.packing import TrainSeq, dp_partition

if TYPE_CHECKING:
    from agentloop.trainers.checkpoint import RunState
    from agentloop.trainers.disagg import RolloutPool

__all__ = ["WorkerGroup", "open_worker_group", "shard_indices"]

R = TypeVar("R")

# calls `method(*args)` on every rank, one args tuple per rank; returns the results in rank order
CallAll = Callable[[str, Sequence[tuple[Any, ...]]], Awaitable[list[Any]]]


def shard_indices(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Sequence indices per rank, balanced on workload; equal counts when they divide evenly
    (a rank may get none when there are fewer sequences than ranks: it still joins in)."""
    if world_size == 1:
        return [list(range(len(lengths)))]
    if len(lengths) < world_size:
        return [[i] if i < len(lengths) else [] for i in range(world_size)]
    return dp_partition(lengths, world_size, equal_size=len(lengths) % world_size == 0)


class WorkerGroup:
    """``world_size`` colocated workers behind batch-level collective calls. ``info`` holds each
    rank's ``{"rank", "pid", "node_id"}``."""

    def __init__(
        self,
        call_all: CallAll,
        world_size: int,
        engine: Engine | None,
        info: Sequence[dict[str, Any]] = (),
        *,
        owns_engines: bool = True,
        pool: RolloutPool | None = None,
    ) -> None:
        self._call_all = call_all
        self.world_size = world_size
        self.engine = engine
        self.info = list(info)
        self.pool = pool  # disaggregated placement: the rollout workers (else engines colocate)
        # the workers' own vLLM engines (weights to sync, memory to free), not an outside engine
        self.owns_engines = owns_engines and engine is not None

    async def _broadcast(self, method: str, *args: Any) -> list[Any]:
        return await self._call_all(method, [args] * self.world_size)

    async def compute_logprobs(
        self, seqs: Sequence[TrainSeq], *, ref: bool = False
    ) -> list[torch.Tensor]:
        """Per-sequence logprobs ``[L_i]`` of the policy (or the reference model)."""
        shards = shard_indices([len(s) for s in seqs], self.world_size)
        results = await self._call_all(
            "compute_logprobs", [([seqs[i] for i in idx], ref) for idx in shards]
        )
        out: list[torch.Tensor | None] = [None] * len(seqs)
        for idx, lps in zip(shards, results, strict=True):
            for i, lp in zip(idx, lps, strict=True):
                out[i] = lp
        return [x for x in out if x is not None]

    async def train_step(self, seqs: Sequence[TrainSeq]) -> dict[str, float]:
        """One optimiser update on the whole mini-batch ``seqs``; global metrics."""
        shards = shard_indices([len(s) for s in seqs], self.world_size)
        results = await self._call_all("train_step", [([seqs[i] for i in idx],) for idx in shards])
        metrics: dict[str, float] = results[0]
        return metrics

    async def sync_weights(
        self, version: int | None = None, *, interrupt: bool = False
    ) -> dict[str, float]:
        """Reload the policy's current weights into every engine as policy ``version``
        (``interrupt``: running requests resume on the new weights instead of being waited
        for; see :meth:`VLLMEngine.update_weights`). Disaggregated: pushed from trainer rank 0
        to the rollout workers."""
        if self.pool is not None:
            return await self.pool.push(version or 0, interrupt=interrupt)
        stats: list[dict[str, float]] = await self._broadcast("sync_weights", version, interrupt)
        return stats[0]

    async def serve(self, work: Awaitable[R], version: int) -> R:
        """Await ``work`` (the trainer waiting for rollouts); disaggregated, a restarted rollout
        worker gets the trainer's weights (policy ``version``) meanwhile."""
        if self.pool is None:
            return await work
        return await self.pool.serve(work, version)

    async def sleep_engines(self, level: int = 1) -> None:
        if self.pool is None:  # separate rollout workers have nothing to free for the trainer
            await self._broadcast("sleep_engine", level)

    async def wake_engines(self, tags: list[str] | None = None) -> None:
        if self.pool is None:
            await self._broadcast("wake_engine", tags)

    async def save_checkpoint(
        self, root: Path, *, step: int, run_state: RunState | None, keep_last: int | None
    ) -> Path:
        paths = await self._broadcast("save_checkpoint", str(root), step, run_state, keep_last)
        return Path(paths[0])

    async def load_checkpoint(
        self, path: Path, *, allow_unverified: bool = False
    ) -> RunState | None:
        states: list[RunState | None] = await self._broadcast(
            "load_checkpoint", str(path), allow_unverified
        )
        return states[0]

    async def export(self, path: Path) -> None:
        """Write the policy as a plain HF model dir (config, safetensors, tokenizer files)."""
        await self._broadcast("export", str(path))


def worker_spec(cfg: TrainConfig, model_dir: Path, *, threaded: bool) -> WorkerSpec:
    """What every worker of a run builds (no engine when replaying saved trajectories)."""
    engine = None if cfg.rollout.replay is not None else cfg.engine_settings()
    return WorkerSpec(str(model_dir), cfg.actor, engine, with_ref=cfg.needs_ref, threaded=threaded)


@contextlib.asynccontextmanager
async def open_worker_group(
    cfg: TrainConfig, model_dir: Path, *, engine: Engine | None = None
) -> AsyncIterator[WorkerGroup]:
    """Start the workers ``cfg.trainer.placement`` asks for, and stop them on exit.

    ``engine`` (local placement only) replaces the worker's own vLLM engine for rollouts, e.g. a
    scripted :class:`~agentloop.engines.fake.FakeEngine` in tests; no weights are synced into it.
    """
    if engine is not None and cfg.trainer.placement != "local":
        raise ConfigError("an outside engine works with trainer.placement=local only")
    if cfg.trainer.placement == "ray":
        from agentloop.trainers.ray_group import open_ray_group

        spec = worker_spec(cfg, model_dir, threaded=True)
        async with open_ray_group(cfg.ray, cfg.trainer, spec) as group:
            yield group
        return
    # async modes overlap rollouts with training: torch work must leave the event loop free
    spec = worker_spec(cfg, model_dir, threaded=cfg.trainer.mode != "sync")
    if engine is not None:
        spec = dataclasses.replace(spec, engine=None)
    worker = ColocatedWorker(spec)
    try:
        await worker.start_engine()
        info = await worker.setup(0, 1, None)

        async def call_all(method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
            return [await getattr(worker, method)(*args[0])]

        own = engine is None
        yield WorkerGroup(call_all, 1, worker.engine if own else engine, [info], owns_engines=own)
    finally:
        await asyncio.shield(worker.close())
