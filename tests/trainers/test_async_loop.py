"""The GRPO loop in one_step and async modes without vLLM: a scripted engine, a real FSDP2 worker
on a micro model. Covers the modes' wiring (the same training half as sync), their metrics,
DAPO dynamic sampling in async mode, and an async resume that trains the same prompts in the
same order as an uninterrupted run. Versions per token on a real engine: test_async_vllm.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentloop.engines.base import SamplingParams
from agentloop.engines.fake import FakeEngine
from agentloop.envs.calc import make_calc_task
from agentloop.trainers.config import TrainConfig, load_config
from agentloop.trainers.grpo import StepInfo, train_async
from agentloop.trainers.metrics import read_metrics

NUM_TASKS = 16


def scripted_engine(tokenizer: Any, *, constant_even: bool = False) -> FakeEngine:
    """Answers right when the episode's seed is even, else ``\\boxed{0}`` (``constant_even``:
    tasks with an even answer are always answered right, so their groups score constant)."""
    answers = {
        t.data["prompt"]: t.data["answer"]
        for t in (make_calc_task("train", i) for i in range(NUM_TASKS))
    }

    def script(prompt_ids: Sequence[int], sampling: SamplingParams) -> str:
        text = tokenizer.decode(list(prompt_ids))
        answer = next(a for p, a in answers.items() if p in text)
        right = (constant_even and int(answer) % 2 == 0) or (sampling.seed or 0) % 2 == 0
        return f"\\boxed{{{answer}}}" if right else "\\boxed{0}"

    return FakeEngine(script, tokenizer=tokenizer, eos_token_id=2, latency_s=0.01)


def _config(model: Path, out: Path, *extra: str) -> TrainConfig:
    return load_config(
        TrainConfig,
        None,
        [f"model.path={model}", f"trainer.out_dir={out}", f"data.num_train_tasks={NUM_TASKS}",
         "trainer.total_steps=3", "trainer.prompts_per_step=2", "rollout.n=4",
         "rollout.max_prompt_len=384", "rollout.max_response_len=16", "actor.lr=3e-3",
         "actor.tis_cap=2.0", "actor.device=cpu", "actor.max_tokens_per_micro_batch=1024",
         "logging.progress=false", "logging.wandb=false", "logging.tensorboard=false",
         "checkpoint.every=1", "checkpoint.keep_last=1", "checkpoint.export_final=false",
         *extra],
    )  # fmt: skip


def _run(cfg: TrainConfig, engine: FakeEngine) -> list[StepInfo]:
    seen: list[StepInfo] = []

    async def on_step(info: StepInfo) -> None:
        seen.append(info)

    asyncio.run(train_async(cfg, engine=engine, on_step=on_step))
    return seen


@pytest.mark.parametrize("mode", ["one_step", "async"])
def test_async_modes_train_with_the_sync_training_code(
    micro_model_dir: Path, tmp_path: Path, tokenizer: Any, mode: str
) -> None:
    cfg = _config(micro_model_dir, tmp_path / "run", f"trainer.mode={mode}")
    seen = _run(cfg, scripted_engine(tokenizer))
    assert [i.step for i in seen] == [1, 2, 3]
    metrics = read_metrics(tmp_path / "run")
    for step, m in metrics.items():
        assert len(seen[step - 1].groups) == cfg.trainer.prompts_per_step
        assert 0 < m["rollout/reward_mean"] < 1 and m["actor/grad_norm"] > 0
        assert m["actor/updates"] == 1 and "actor/tis_mean" in m
        assert 0 <= m["perf/trainer_idle_frac"] <= 1 and 0 <= m["perf/rollout_idle_frac"] <= 1
    if mode == "async":
        assert all(m["async/capacity"] >= 0 and "async/wait_s" in m for m in metrics.values())
    trained = [g.task.id for i in seen for g in i.groups]
    assert len(trained) == len(set(trained))  # no prompt trained twice


def test_async_dynamic_sampling_drops_constant_groups_as_they_arrive(
    micro_model_dir: Path, tmp_path: Path, tokenizer: Any
) -> None:
    cfg = _config(micro_model_dir, tmp_path / "run", "trainer.mode=async",
                  "algorithm.dynamic_sampling=true", "trainer.total_steps=2")  # fmt: skip
    seen = _run(cfg, scripted_engine(tokenizer, constant_even=True))
    metrics = read_metrics(tmp_path / "run")
    assert sum(m["rollout/dropped_groups"] for m in metrics.values()) >= 1
    for info in seen:
        assert len(info.groups) == cfg.trainer.prompts_per_step
        assert all(len(set(g.rewards_G)) > 1 for g in info.groups)


@pytest.mark.parametrize("mode", ["async", "one_step"])
def test_a_resume_trains_the_same_prompts_in_the_same_order(
    micro_model_dir: Path, tmp_path: Path, tokenizer: Any, mode: str
) -> None:
    """A run stopped after step 2 resumes to step 4 and trains exactly what an uninterrupted
    4-step run trains: async keeps its unconsumed groups in the checkpoint (wait policy: start
    order), one_step generates the batch it was prefetching again (same prompts and seeds)."""
    steps = (f"trainer.mode={mode}", "trainer.total_steps=4")
    whole = _run(_config(micro_model_dir, tmp_path / "whole", *steps), scripted_engine(tokenizer))
    _run(_config(micro_model_dir, tmp_path / "cut", f"trainer.mode={mode}",
                 "trainer.total_steps=2"), scripted_engine(tokenizer))  # fmt: skip
    rest = _run(_config(micro_model_dir, tmp_path / "cut", *steps), scripted_engine(tokenizer))
    assert [i.step for i in rest] == [3, 4]
    if mode == "async":
        assert read_metrics(tmp_path / "cut")[3]["async/restored_groups"] >= 1

    def prompts(infos: list[StepInfo]) -> list[tuple[str, tuple[float, ...]]]:
        return [(g.task.id, g.rewards_G) for i in infos for g in i.groups]

    assert prompts(rest) == prompts(whole[2:])
