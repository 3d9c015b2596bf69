"""Acceptance: SFT on synthetic Calc traces lowers the loss and raises the tiny model's Calc
accuracy, measured with the real rollout loop (``agentloop eval``'s, on the session's vLLM
engine) before and after."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from agentloop.envs.calc_traces import TraceConfig, make_calc_traces, write_traces
from agentloop.eval import EvalConfig, eval_async
from agentloop.eval_report import compare_runs
from agentloop.rollout import RolloutConfig
from agentloop.trainers.config import example_config, load_config
from agentloop.trainers.metrics import read_metrics
from agentloop.trainers.sft import SFTConfig

ENV = "agentloop/Calc-v0"
DIGITS = 2
NUM_TASKS = 32
# Greedy, short: a correct episode is call (~31 tokens) + output + box (~8 tokens).
ROLLOUT = RolloutConfig(max_turns=3, max_prompt_len=448, max_response_len=64, temperature=0.0)
VLLM = {"dtype": "float32", "max_num_seqs": 32, "kv_cache_memory_bytes": 128 << 20,
        "enforce_eager": True}  # fmt: skip


async def _eval(engine: Any, model: Path, out: Path) -> float:
    """Calc accuracy of ``model`` (its tokenizer, config hash) with ``engine`` serving it."""
    config = EvalConfig(
        ENV, str(model), out, n=1, num_tasks=NUM_TASKS, split="test", engine="vllm",
        rollout=ROLLOUT, env_kwargs={"digits": DIGITS}, engine_args=VLLM,
    )  # fmt: skip
    summary = await eval_async(config, engine=engine, progress=False)
    assert summary.episodes == NUM_TASKS
    return float(summary.reward.mean)


def _weights(model: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {n: t for f in sorted(model.glob("*.safetensors")) for n, t in load_file(f).items()}


@pytest.mark.timeout(1800)
@pytest.mark.asyncio(loop_scope="session")  # the shared vLLM engine lives in the session loop
async def test_sft_on_calc_traces_raises_accuracy(
    vllm_engine: Any, sft_run: Callable[[SFTConfig], Any], tiny_model_dir: Path, tmp_path: Path
) -> None:
    # The shipped recipe: 2500 rows, 2% held out, batches of 5 = 490 optimiser steps (~5 min on
    # two cores). The copying skill appears after ~200-300 steps; the rest is margin. The fake
    # sandbox runs the same Python in-process (test_sft_data checks it gives the local sandbox's
    # rows); the evals below use the env's real (bubblewrap) sandbox, on the session's vLLM
    # engine: the tiny model's weights before, the SFT export's after (put back at the end).
    traces = TraceConfig(num_traces=500, num_compact=2000, digits=DIGITS, sandbox="fake")
    path = write_traces(await make_calc_traces(traces), tmp_path / "traces.jsonl")
    overrides = [f"data.train={path}", f"trainer.out_dir={tmp_path / 'sft'}",
                 "model.path=" + str(tiny_model_dir), "logging.progress=false"]  # fmt: skip
    cfg = load_config(SFTConfig, example_config("sft_calc_tiny"), overrides)

    before = await _eval(vllm_engine, tiny_model_dir, tmp_path / "eval_before")
    result = await asyncio.to_thread(sft_run, cfg)
    export = result.export_dir
    assert export is not None
    version = vllm_engine.version
    await vllm_engine.update_weights(_weights(export).items(), version=version + 1)
    try:
        after = await _eval(vllm_engine, export, tmp_path / "eval_after")
    finally:
        await vllm_engine.update_weights(_weights(tiny_model_dir).items(), version=version)

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
