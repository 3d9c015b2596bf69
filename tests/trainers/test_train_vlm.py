"""The tiny DeepEyes recipe (``recipes/deepeyes/tiny.yaml``: the tiny Qwen2.5-VL-shaped model,
ZoomVQA-v0, ``engine.backend: hf``) through ``agentloop train`` on the paths other than local
sync (tests/vision/test_vlm_rollout.py runs that one, on a model taught the zoom call): Ray
placement with two colocated workers, and async training. Every episode shows the overview
image, so images cross Ray, the trainer's packed micro-batches and (async) weight updates that
interrupt running requests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentloop.cli import main

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

RECIPE = Path(__file__).resolve().parents[2] / "recipes/deepeyes/tiny.yaml"
STEPS = 3


def train(
    out: Path, *overrides: str, steps: int = STEPS
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run the recipe until step ``steps``; its metrics lines and saved trajectories."""
    args = ["train", str(RECIPE), f"trainer.out_dir={out}", f"trainer.total_steps={steps}"]
    assert main([*args, *overrides]) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    records = [json.loads(line) for f in sorted((out / "trajectories").iterdir())
               for line in f.read_text().splitlines()]  # fmt: skip
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    assert len(records) == steps * 8 and all(r["images"] for r in records)
    assert all(len(r["images"]) == len(r["image_grids"]) for r in records)
    return metrics, records


def test_the_tiny_deepeyes_recipe_trains_on_two_ray_workers(
    local_ray: None, tmp_path: Path
) -> None:
    """placement: ray, two colocated workers: each serves its share of the episodes, the
    trainer scores them at the engine's logprobs (text level), weights reach both engines."""
    metrics, _ = train(tmp_path / "run", "trainer.placement=ray", "trainer.num_workers=2",
                       "ray.num_cpus=2")  # fmt: skip
    mismatch = [m["mismatch/abs_diff_max"] for m in metrics]
    assert all(x < 1e-4 for x in mismatch), mismatch
    assert all(m["sync/tensors"] > 0 for m in metrics), metrics


def test_the_tiny_deepeyes_recipe_trains_asynchronously(tmp_path: Path) -> None:
    """trainer.mode=async: episodes are generated while the trainer updates; a weight update
    interrupts running requests (partial rollouts) and no trained token is more than
    max_staleness versions old."""
    metrics, records = train(tmp_path / "run", "trainer.mode=async", "trainer.max_staleness=1")
    assert all(m["async/staleness_max"] <= 1 for m in metrics), metrics
    assert max(m["async/engine_version"] for m in metrics) == STEPS - 1
    for r in records:  # every sampled token carries the version that sampled it, others -1
        sampled = [v for v, m in zip(r["versions"], r["loss_mask"], strict=True) if m]
        assert sampled and min(sampled) >= 0, r["task_id"]
        assert max(sampled) - min(sampled) <= 1  # resumed at most once: one update per step


def test_the_tiny_deepeyes_recipe_resumes_from_a_checkpoint_in_the_same_data_order(
    tmp_path: Path,
) -> None:
    """Two steps with a checkpoint after each, then ``resume: auto`` to step 3: every step's
    prompts are the sampler's (trainer.seed) in order, across the restart."""
    from agentloop.envs import make
    from agentloop.trainers.data import PromptSampler

    out = tmp_path / "run"
    train(out, "checkpoint.every=1", steps=2)
    _, records = train(out, "checkpoint.every=1")
    sampler = PromptSampler(make("agentloop/ZoomVQA-v0").tasks("train"), seed=0)
    expected = [sorted(t.id for t in sampler.next_batch(2)) for _ in range(STEPS)]
    played = [sorted({r["task_id"] for r in records if r["step"] == s}) for s in (1, 2, 3)]
    assert played == expected
