"""bench/gpu/recipe_memory.py's dry run on the CPU, so that the GPU bench cannot rot: its
overrides of the ReTool 7B recipe (a random 7B model, task files it writes, a shorter run) load
against the training config's schema, and the printed command is ``agentloop train`` on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_recipe_memory_bench_overrides_load_against_the_recipe(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench/gpu/recipe_memory.py"), "--dry-run",
         "--work", str(tmp_path), "--gpus", "4"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    assert "train" in out and "recipes/retool/dapo_7b.yaml" in out
    assert "trainer.num_workers=4" in out and "algorithm.dynamic_sampling=false" in out
    assert (tmp_path / "data" / "train.jsonl").stat().st_size > 0
