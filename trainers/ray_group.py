"""Ray placement: one bundle per device, one colocated FSDP2 + vLLM actor per bundle, a router.

With ``trainer.rollout_workers`` N > 0 the placement is disaggregated: the trainer actors hold no
engine, and N rollout actors (``trainers/disagg.py``), one bundle each, serve the rollouts.

Joins the cluster ``ray.address`` names (``auto`` for a running one, which is how multi-node
runs start) or starts a private local Ray, and shuts down only what it started: its actors, its
placement group and, if it started Ray, that Ray instance by its own handle (never a
host-wide stop that would end Ray processes it did not start).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from agentloop.engines.base import Engine, SamplingParams
from agentloop.engines.router import ReplicatedEngine
from agentloop.errors import ConfigError
from agentloop.trainers.colocated import ColocatedWorker, WorkerSpec
from agentloop.trainers.config_infra import RayConfig, TrainerConfig
from agentloop.trainers.group import WorkerGroup
from agentloop.types import Completion
from agentloop.vision import is_vision_model

if TYPE_CHECKING:
    from agentloop.trainers.disagg import RolloutPool

__all__ = ["RayEngineClient", "open_ray_group"]

log = logging.getLogger(__name__)
_PLACEMENT_TIMEOUT_S = 120.0


class RayEngineClient:
    """The Engine protocol over one colocated actor's vLLM engine (a router replica);
    ``supports_images``: the engine serves a vision-language model."""

    def __init__(self, actor: Any, *, supports_images: bool = False) -> None:
        self.actor = actor
        self._supports_images = supports_images

    @property
    def supports_images(self) -> bool:
        return self._supports_images

    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[Any] = (),
    ) -> Completion:
        result: Completion = await self.actor.generate.remote(
            list(prompt_ids), sampling, session_id, tuple(images)
        )
        return result


def _start_ray(cluster: RayConfig) -> bool:
    """Connect to (or start) Ray; return whether this call started it."""
    import ray

    if ray.is_initialized():
        return False
    if cluster.address is not None:
        ray.init(address=cluster.address, log_to_driver=True)
    else:
        # Ray starts its workers at nice 15 (worker_niceness), below its own daemons; here the
        # workers are the run (trainers, vLLM engines), which local placement runs at nice 0.
        # At 15 any busy process beside them (another job, the other test lane) starves them: a
        # 2.3 s CPU task in an actor took 44 s beside two busy processes, 5.2 s at nice 0.
        ray.init(
            num_cpus=cluster.num_cpus,
            include_dashboard=False,
            log_to_driver=True,
            _system_config={"worker_niceness": 0},
        )
    return True


def _bundle(cpus: float, gpus: float | None) -> dict[str, float]:
    import ray

    if gpus is None:
        gpus = 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
    return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}


async def _placement_group(cluster: RayConfig, trainer: TrainerConfig) -> Any:
    """Bundles ``0 .. num_workers-1`` for the trainers, then one per rollout worker."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle = _bundle(cluster.cpus_per_worker, cluster.gpus_per_worker)
    rollout = _bundle(cluster.cpus_per_rollout_worker, cluster.gpus_per_rollout_worker)
    n = trainer.num_workers
    bundles = [dict(bundle) for _ in range(n)]
    bundles += [dict(rollout) for _ in range(trainer.rollout_workers)]
    pg = placement_group(bundles, strategy=cluster.placement_strategy)
    try:
        await asyncio.wait_for(pg.ready(), _PLACEMENT_TIMEOUT_S)
    except TimeoutError:
        remove_placement_group(pg)
        raise ConfigError(
            f"Ray could not place {n} workers of {bundle} and {trainer.rollout_workers} "
            f"rollout workers of {rollout} ({cluster.placement_strategy}) in "
            f"{_PLACEMENT_TIMEOUT_S:.0f} s; the cluster has {ray.cluster_resources()}: lower "
            "trainer.num_workers or ray.cpus_per_worker/gpus_per_worker, or add nodes"
        ) from None
    return pg, bundle


@contextlib.asynccontextmanager
async def open_ray_group(
    cluster: RayConfig, trainer: TrainerConfig, spec: WorkerSpec
) -> AsyncIterator[WorkerGroup]:
    """``trainer.num_workers`` colocated actors in one placement group, started and set up
    (engines first, then the process group), and torn down on exit."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    started = _start_ray(cluster)
    pg: Any = None
    actors: list[Any] = []
    pool: RolloutPool | None = None
    disaggregated = trainer.rollout_workers > 0 and spec.engine is not None
    engine_settings = spec.engine
    if disaggregated:
        spec = dataclasses.replace(spec, engine=None)
    try:
        pg, bundle = await _placement_group(cluster, trainer)
        remote_cls = ray.remote(ColocatedWorker)
        for i in range(trainer.num_workers):
            strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)
            actors.append(
                remote_cls.options(
                    num_cpus=bundle["CPU"],
                    num_gpus=bundle.get("GPU", 0),
                    scheduling_strategy=strategy,
                    max_concurrency=1024,
                ).remote(spec)
            )
        if disaggregated:
            assert engine_settings is not None
            pool = _rollout_pool(cluster, trainer, pg, actors, spec.model_dir, engine_settings)
        info = await _start(actors, pool)
        n = len(actors)

        async def call_all(method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
            refs = [getattr(a, method).remote(*x) for a, x in zip(actors, args, strict=True)]
            return list(await asyncio.gather(*refs))

        vlm = is_vision_model(spec.model_dir)
        engine: Engine | None = (
            ReplicatedEngine([RayEngineClient(a, supports_images=vlm) for a in actors])
            if spec.engine
            else None
        )
        if pool is not None:
            engine = pool
        log.info("ray workers: %s", info)
        yield WorkerGroup(call_all, n, engine, info, pool=pool)
    finally:
        if pool is not None:
            await pool.close()
        await _teardown(actors, pg, started)


async def _start(trainers: list[Any], pool: RolloutPool | None) -> list[dict[str, Any]]:
    """Start the trainer actors (engines first, then the process group and the policy shards)
    and, beside them, the rollout workers of ``pool`` (if any): the trainers load the policy
    while the workers start vLLM, tens of seconds each on a small machine. The first failure
    is raised (the caller closes what started); the trainers' info, in rank order."""

    async def trainers_up() -> list[dict[str, Any]]:
        await asyncio.gather(*(a.start_engine.remote() for a in trainers))
        host, port = await trainers[0].address.remote()
        n = len(trainers)
        return list(
            await asyncio.gather(
                *(a.setup.remote(i, n, f"tcp://{host}:{port}") for i, a in enumerate(trainers))
            )
        )

    up = asyncio.ensure_future(trainers_up())
    jobs: list[asyncio.Future[Any]] = [up]
    if pool is not None:
        jobs.append(asyncio.ensure_future(pool.start()))
    try:
        await asyncio.gather(*jobs)
    except BaseException:
        for job in jobs:  # stop waiting for the other side
            job.cancel()
        raise
    return up.result()


def _rollout_pool(
    cluster: RayConfig,
    trainer: TrainerConfig,
    pg: Any,
    trainers: list[Any],
    model_dir: str,
    settings: dict[str, Any],
) -> RolloutPool:
    """The rollout workers of a disaggregated run (bundles after the trainers'), not started."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from agentloop.trainers.disagg import RolloutPool, RolloutWorker

    remote_cls = ray.remote(RolloutWorker)
    bundle = _bundle(cluster.cpus_per_rollout_worker, cluster.gpus_per_rollout_worker)

    def make_actor(i: int) -> Any:
        strategy = PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=trainer.num_workers + i
        )
        return remote_cls.options(
            num_cpus=bundle["CPU"],
            num_gpus=bundle.get("GPU", 0),
            scheduling_strategy=strategy,
            max_concurrency=1024,
        ).remote(model_dir, settings)

    return RolloutPool(
        make_actor,
        trainer.rollout_workers,
        trainers,
        supports_images=is_vision_model(model_dir),
        restart_timeout_s=cluster.restart_timeout_s,
        push_timeout_s=cluster.weight_push_timeout_s,
    )


async def _teardown(actors: list[Any], pg: Any, started: bool) -> None:
    import ray
    from ray.util.placement_group import remove_placement_group

    if actors:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                asyncio.gather(*(a.close.remote() for a in actors), return_exceptions=True), 120
            )
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
    if pg is not None:
        with contextlib.suppress(Exception):
            remove_placement_group(pg)
    if started:
        ray.shutdown()
