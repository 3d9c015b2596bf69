"""Acceptance: SFT on synthetic Calc traces lowers the loss and raises the tiny model's Calc
accuracy, measured with the real rollout loop (``agentloop eval``'s, on the session's vLLM
engine) before and after.

The SFT run is the demo's cold start (the session's ``demo_run``, tests/short_demo.py): one
SFT of the tiny model serves this test and the demo's, and it trains with the shipped
``sft_calc_tiny`` recipe's settings (tests/recipes/test_demo_config.py pins that), so this is
that recipe's acceptance too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from short_demo import DemoRun

from agentloop.eval import EvalConfig, eval_async
from agentloop.eval_report import compare_runs
from agentloop.rollout import RolloutConfig
from agentloop.trainers.metrics import read_metrics

ENV = "agentloop/Calc-v0"
NUM_TASKS = 32
# Greedy, short: a correct episode is call (~31 tokens) + output + box (~8 tokens).
ROLLOUT = RolloutConfig(max_turns=3, max_prompt_len=448, max_response_len=64, temperature=0.0)
VLLM = {"dtype": "float32", "max_num_seqs": 32, "kv_cache_memory_bytes": 128 << 20,
        "enforce_eager": True}  # fmt: skip


async def _eval(engine: Any, model: Path, digits: int, out: Path) -> float:
    """Calc accuracy of ``model`` (its tokenizer, config hash) with ``engine`` serving it."""
    config = EvalConfig(
        ENV, str(model), out, n=1, num_tasks=NUM_TASKS, split="test", engine="vllm",
        rollout=ROLLOUT, env_kwargs={"digits": digits}, engine_args=VLLM,
    )  # fmt: skip
    summary = await eval_async(config, engine=engine, progress=False)
    assert summary.episodes == NUM_TASKS
    return float(summary.reward.mean)


def _weights(model: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {n: t for f in sorted(model.glob("*.safetensors")) for n, t in load_file(f).items()}


@pytest.mark.timeout(3600)
@pytest.mark.asyncio(loop_scope="session")  # the shared vLLM engine lives in the session loop
async def test_sft_on_calc_traces_raises_accuracy(
    vllm_engine: Any, demo_run: DemoRun, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # The demo's cold start: 2000 rows (400 rollout-format, 1600 compact), 2% held out, batches
    # of 5, 350 optimiser steps. The copying skill appears after ~200-300 steps. The evals below
    # use the env's real (bubblewrap) sandbox, on the session's vLLM engine: the tiny model's
    # weights before, the SFT export's after (put back at the end).
    sft, digits = demo_run.result.sft, demo_run.configs.demo.digits
    assert sft.export_dir is not None
    before = await _eval(vllm_engine, tiny_model_dir, digits, tmp_path / "eval_before")
    version = vllm_engine.version
    await vllm_engine.update_weights(_weights(sft.export_dir).items(), version=version + 1)
    try:
        after = await _eval(vllm_engine, sft.export_dir, digits, tmp_path / "eval_after")
    finally:
        await vllm_engine.update_weights(_weights(tiny_model_dir).items(), version=version)

    metrics = read_metrics(sft.out_dir)
    losses = [m["sft/loss"] for s, m in sorted(metrics.items()) if "sft/loss" in m]
    assert len(losses) == sft.steps == demo_run.configs.sft.trainer.max_steps
    assert sum(losses[-20:]) / 20 < 0.25 * sum(losses[:20]) / 20
    assert sft.eval_loss_before is not None and sft.eval_loss_after is not None
    assert sft.eval_loss_after < 0.1 * sft.eval_loss_before
    comparison = compare_runs(tmp_path / "eval_before", tmp_path / "eval_after")
    ci = [comparison.result.lo, comparison.result.hi]
    report = json.dumps({"before": before, "after": after, "ci": ci})
    print(report)
    assert before == 0.0, report  # the random tiny model never computes an answer
    assert after >= 0.15, report
    assert comparison.result.lo > 0, report  # paired bootstrap over tasks: the gain is not noise
