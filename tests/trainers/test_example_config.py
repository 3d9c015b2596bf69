"""The shipped example config, run the way a user runs it: ``agentloop train grpo_calc_tiny``.

It starts from ``model.path: tiny-calc``, the tiny model after the demo's cold-start SFT. The
suite's shortened demo (the ``demo_run`` fixture) trains that SFT with the shipped recipe and
publishes it into the ``tiny-calc`` cache, as ``make demo`` does, so the example finds it built.
The run here is the shipped config cut to one step of 4 prompts (32 episodes; 119 → 66 s on one
core), validated only before it: it shows the model is the demo's, that it solves held-out tasks
before any RL, and that its groups hold the mixed rewards GRPO learns from.
That the same model and RL settings learn is the demo test's claim (tests/recipes/test_demo.py:
RL beats the SFT checkpoint on paired held-out tasks); the full example's numbers are in its
header. The LoRA variant is the training guide's command (``actor.lora.rank=16``): the same step
with adapters on the policy, each sync the adapter alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from grpo_helpers import TrainMain
from short_demo import DemoRun

from agentloop.eval_report import SUMMARY_FILE, EvalSummary
from agentloop.io import read_jsonl
from agentloop.models.cold_start import cold_start_dir
from agentloop.trainers.config import TrainConfig, example_config, load_config
from agentloop.trainers.metrics import read_metrics

STEPS = 1
#: docs/guides/training.md, LoRA: the example with adapters
LORA = ("actor.lora.rank=16", "actor.lora.alpha=32", "actor.lr=1e-3")


@pytest.mark.timeout(3600)  # the demo fixture included, when this test builds it
@pytest.mark.parametrize("lora", [(), LORA], ids=["full", "lora"])
def test_the_shipped_example_starts_from_the_demos_sft_and_has_rewards_to_learn_from(
    train_main: TrainMain, demo_run: DemoRun, tmp_path: Path, lora: tuple[str, ...]
) -> None:
    cfg = load_config(TrainConfig, example_config("grpo_calc_tiny"))
    assert cfg.model.path == "tiny-calc"
    out, log = tmp_path / "run", tmp_path / "train.log"
    args = ["grpo_calc_tiny", f"trainer.out_dir={out}", f"trainer.total_steps={STEPS}",
            "trainer.val_every=0", "data.num_val_tasks=16", "trainer.prompts_per_step=4",
            "logging.progress=false", *lora]  # fmt: skip
    assert train_main(args, log) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "building it once" not in text, "the demo's SFT was not published as tiny-calc"
    [model_dir] = [
        line.split()[1].rstrip(",") for line in text.splitlines() if line.startswith("model ")
    ]
    assert Path(model_dir) == cold_start_dir(demo_run.configs)  # where the demo published
    # before any RL the model solves held-out tasks: its reward is not the random model's 0
    before = EvalSummary.from_dict(
        json.loads((out / "val" / "step_000000" / SUMMARY_FILE).read_text())
    )
    assert before.reward.mean > 0, before
    metrics = {s: m for s, m in read_metrics(out).items() if s > 0}  # step 0: validation only
    assert sorted(metrics) == list(range(1, STEPS + 1))
    rows = [r for s in metrics for r in read_jsonl(out / "trajectories" / f"step_{s:06d}.jsonl")]
    groups: dict[tuple[int, int], list[float]] = {}
    for r in rows:
        groups.setdefault((r["step"], r["group"]), []).append(r["reward"])
    mixed = [g for g in groups.values() if min(g) < max(g)]
    assert mixed, f"no group's rewards differed: GRPO had nothing to learn from: {groups}"
    model_bytes = (Path(model_dir) / "model.safetensors").stat().st_size
    for step, m in metrics.items():
        assert m["rollout/failed_frac"] == 0.0 and m["adv/abs_mean"] > 0, (step, m)
        # full fine-tuning syncs every weight; LoRA the adapter alone, a small share of them
        assert (m["sync/bytes"] < model_bytes / 10) == bool(lora), (m["sync/bytes"], model_bytes)
