"""The tiny DeepEyes recipe (``recipes/deepeyes/tiny.yaml``: the tiny Qwen2.5-VL-shaped model,
ZoomVQA-v0, ``engine.backend: hf``) run through ``agentloop train``, for the tests of its
placements and modes (test_train_vlm.py, test_train_vlm_async.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentloop.cli import main

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
