"""The tiny DeepEyes recipe (``recipes/deepeyes/tiny.yaml``) through ``agentloop train`` in
async mode (weight updates that interrupt running requests, resumed on the new weights) and
resumed from a checkpoint. (Ray placement: test_train_vlm.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vlm_runs import train

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]


def test_the_tiny_deepeyes_recipe_trains_asynchronously(tmp_path: Path) -> None:
    """trainer.mode=async: episodes are generated while the trainer updates; a weight update
    interrupts running requests (partial rollouts) and no trained token is more than
    max_staleness versions old. Two steps: step 2's episodes run while step 1's update lands."""
    steps = 2
    metrics, records = train(
        tmp_path / "run", "trainer.mode=async", "trainer.max_staleness=1", steps=steps
    )
    assert all(m["async/staleness_max"] <= 1 for m in metrics), metrics
    assert max(m["async/engine_version"] for m in metrics) == steps - 1
    for r in records:  # every sampled token carries the version that sampled it, others -1
        sampled = [v for v, m in zip(r["versions"], r["loss_mask"], strict=True) if m]
        assert sampled and min(sampled) >= 0, r["task_id"]
        assert max(sampled) - min(sampled) <= 1  # resumed at most once: one update per step


def test_the_tiny_deepeyes_recipe_resumes_from_a_checkpoint_in_the_same_data_order(
    tmp_path: Path,
) -> None:
    """One step and its checkpoint, then ``resume: auto`` to step 2: every step's prompts are
    the sampler's (trainer.seed) in order, across the restart."""
    from agentloop.envs import make
    from agentloop.trainers.data import PromptSampler

    out = tmp_path / "run"
    train(out, "checkpoint.every=1", steps=1)
    _, records = train(out, "checkpoint.every=1", steps=2)
    sampler = PromptSampler(make("agentloop/ZoomVQA-v0").tasks("train"), seed=0)
    expected = [sorted(t.id for t in sampler.next_batch(2)) for _ in range(2)]
    played = [sorted({r["task_id"] for r in records if r["step"] == s}) for s in (1, 2)]
    assert played == expected
