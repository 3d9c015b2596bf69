"""Acceptance: SFT on synthetic Calc traces lowers the loss and raises the tiny model's Calc
accuracy, measured with the real rollout loop (``agentloop eval`` on vLLM) before and after."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import torch

from agentloop.envs.calc_traces import TraceConfig, make_calc_traces, write_traces
from agentloop.eval import EvalConfig, run_eval
from agentloop.eval_report import compare_runs
from agentloop.rollout import RolloutConfig
from agentloop.trainers.config import example_config, load_config
from agentloop.trainers.metrics import read_metrics
from agentloop.trainers.sft import SFTConfig, run_sft

ENV = "agentloop/Calc-v0"
DIGITS = 2
NUM_TASKS = 32
# Greedy, short: a correct episode is call (~31 tokens) + output + box (~8 tokens).
ROLLOUT = RolloutConfig(max_turns=3, max_prompt_len=448, max_response_len=64, temperature=0.0)
VLLM = {"dtype": "float32", "max_num_seqs": 32, "kv_cache_memory_bytes": 128 << 20,
        "enforce_eager": True}  # fmt: skip


def _eval(model: Path, out: Path) -> float:
    pytest.importorskip("vllm")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    config = EvalConfig(
        ENV, str(model), out, n=1, num_tasks=NUM_TASKS, split="test", engine="vllm",
        rollout=ROLLOUT, env_kwargs={"digits": DIGITS}, engine_args=VLLM,
    )  # fmt: skip
    summary = run_eval(config, progress=False)
    assert summary.episodes == NUM_TASKS
    return float(summary.reward.mean)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1800)
def test_sft_on_calc_traces_raises_accuracy(tiny_model_dir: Path, tmp_path: Path) -> None:
    torch.set_num_threads(2)  # the trainer conftest pins 1 thread for tiny unit tests
    # The shipped recipe: 2500 rows, 2% held out, batches of 5 = 490 optimiser steps (~5 min on
    # two cores). The copying skill appears after ~200-300 steps; the rest is margin. The fake
    # sandbox runs the same Python in-process (test_sft_data checks it gives the local sandbox's
    # rows); the evals below use the env's real (bubblewrap) sandbox.
    traces = TraceConfig(num_traces=500, num_compact=2000, digits=DIGITS, sandbox="fake")
    path = write_traces(asyncio.run(make_calc_traces(traces)), tmp_path / "traces.jsonl")
    overrides = [f"data.train={path}", f"trainer.out_dir={tmp_path / 'sft'}",
                 "model.path=" + str(tiny_model_dir), "logging.progress=false"]  # fmt: skip
    cfg = load_config(SFTConfig, example_config("sft_calc_tiny"), overrides)

    before = _eval(tiny_model_dir, tmp_path / "eval_before")
    result = run_sft(cfg)
    after = _eval(result.export_dir, tmp_path / "eval_after")  # type: ignore[arg-type]

    metrics = read_metrics(tmp_path / "sft")
    losses = [m["sft/loss"] for s, m in sorted(metrics.items()) if "sft/loss" in m]
    assert len(losses) == result.steps == 490
    assert sum(losses[-20:]) / 20 < 0.25 * sum(losses[:20]) / 20
    assert result.eval_loss_before is not None and result.eval_loss_after is not None
    assert result.eval_loss_after < 0.1 * result.eval_loss_before
    comparison = compare_runs(tmp_path / "eval_before", tmp_path / "eval_after")
    ci = [comparison.result.lo, comparison.result.hi]
    report = json.dumps({"before": before, "after": after, "ci": ci})
    print(report)
    assert before == 0.0, report  # the random tiny model never computes an answer
    assert after >= 0.15, report
    assert comparison.result.lo > 0, report  # paired bootstrap over tasks: the gain is not noise
