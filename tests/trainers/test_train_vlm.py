"""The tiny DeepEyes recipe (``recipes/deepeyes/tiny.yaml``) through ``agentloop train`` with
Ray placement: two colocated workers, each an FSDP2 shard and an HF engine. Every episode shows
the overview image, so images cross Ray and the trainer's packed micro-batches. (Local sync:
tests/vision/test_vlm_rollout.py, on a model taught the zoom call; async and resume:
test_train_vlm_async.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vlm_runs import train

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]


def test_the_tiny_deepeyes_recipe_trains_on_two_ray_workers(
    local_ray: None, tmp_path: Path
) -> None:
    """placement: ray, two colocated workers: each serves its share of the episodes, the
    trainer scores them at the engine's logprobs (text level), weights reach both engines."""
    # two steps of 128-token turns: the second shows the first update reached both engines
    metrics, _ = train(tmp_path / "run", "trainer.placement=ray", "trainer.num_workers=2",
                       "ray.num_cpus=2", "rollout.max_response_len=128", steps=2)  # fmt: skip
    mismatch = [m["mismatch/abs_diff_max"] for m in metrics]
    assert all(x < 1e-4 for x in mismatch), mismatch
    assert all(m["sync/tensors"] > 0 for m in metrics), metrics
