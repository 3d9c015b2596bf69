"""The GRPO loop without vLLM: a scripted engine, a real FSDP2 PolicyWorker on a micro model.

Covers the parts of ``trainers/grpo.py`` that do not need a real engine: the sampler, advantages
over groups, dynamic sampling, metrics, replay (a replayed step gives the same loss and
gradient norm), and that an update moves the policy towards the rewarded answers.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from agentloop.engines.base import SamplingParams
from agentloop.engines.fake import FakeEngine
from agentloop.envs.calc import make_calc_task
from agentloop.trainers.config import TrainConfig, load_config
from agentloop.trainers.data import PromptSampler, read_step_groups, write_step_groups
from agentloop.trainers.group import shard_indices
from agentloop.trainers.grpo import StepInfo, train_async
from agentloop.trainers.metrics import mismatch_metrics, read_metrics, rollout_metrics
from agentloop.types import StopReason, Task, Trajectory, TrajectoryGroup

NUM_TASKS = 8


def _answers() -> dict[str, str]:
    tasks = [make_calc_task("train", i) for i in range(NUM_TASKS)]
    return {t.data["prompt"]: t.data["answer"] for t in tasks}


def scripted_engine(tokenizer: Any, *, constant_even: bool = False) -> FakeEngine:
    """Answers right when the episode's sampling seed is even, else ``\\boxed{0}``. With
    ``constant_even`` tasks with an even answer are always answered right (constant groups)."""
    answers = _answers()

    def script(prompt_ids: Sequence[int], sampling: SamplingParams) -> str:
        text = tokenizer.decode(list(prompt_ids))
        answer = next(a for p, a in answers.items() if p in text)
        right = (constant_even and int(answer) % 2 == 0) or (sampling.seed or 0) % 2 == 0
        return f"\\boxed{{{answer}}}" if right else "\\boxed{0}"

    return FakeEngine(script, tokenizer=tokenizer, eos_token_id=2)


def _config(model: Path, out: Path, *extra: str) -> TrainConfig:
    return load_config(
        TrainConfig,
        None,
        [f"model.path={model}", f"trainer.out_dir={out}", f"data.num_train_tasks={NUM_TASKS}",
         "trainer.total_steps=2", "trainer.prompts_per_step=2", "rollout.n=4",
         "rollout.max_prompt_len=384", "rollout.max_response_len=16", "actor.lr=3e-3",
         "actor.device=cpu", "actor.max_tokens_per_micro_batch=1024", "logging.progress=false",
         "logging.wandb=false", "checkpoint.every=1", "checkpoint.keep_last=1", *extra],
    )  # fmt: skip


# ---------------------------------------------------------------------- pure parts
def test_sampler_order_depends_only_on_seed_and_epoch() -> None:
    tasks = [Task(id=f"t{i}") for i in range(5)]
    a = PromptSampler(tasks, seed=3)
    first = [t.id for t in a.next_batch(7)]  # crosses into epoch 1
    assert sorted(first[:5]) == [f"t{i}" for i in range(5)] and a.epoch == 1
    state = a.state_dict()
    rest = [t.id for t in a.next_batch(6)]
    b = PromptSampler(tasks, seed=3)
    b.load_state_dict(state)
    assert [t.id for t in b.next_batch(6)] == rest
    assert [t.id for t in PromptSampler(tasks, seed=4).next_batch(5)] != first[:5]
    assert [t.id for t in PromptSampler(tasks, shuffle=False).next_batch(3)] == ["t0", "t1", "t2"]


def _traj(task: str, i: int, reward: float, mask: Sequence[int], **kw: Any) -> Trajectory:
    n = len(mask)
    return Trajectory(task_id=task, token_ids=tuple(range(5, 5 + n)), loss_mask=tuple(mask),
                      logprobs=tuple(-0.5 * m for m in mask), prompt_len=2, reward=reward,
                      stop_reason=kw.pop("stop", StopReason.DONE), sample_index=i,
                      metrics=kw.pop("metrics", {}), **kw)  # fmt: skip


def test_step_groups_round_trip(tmp_path: Path) -> None:
    groups = [
        TrajectoryGroup(Task("a", {"answer": "3"}), (_traj("a", 0, 1.0, [0, 0, 1, 1]),
                                                     _traj("a", 1, 0.0, [0, 0, 1]))),
        TrajectoryGroup(Task("b", {"answer": "4"}), (_traj("b", 0, 0.5, [0, 0, 1, 0, 1]),)),
    ]  # fmt: skip
    write_step_groups(tmp_path, 3, groups, "agentloop/Calc-v0")
    assert read_step_groups(tmp_path, 3) == groups


def test_rollout_and_mismatch_metrics_by_hand() -> None:
    calls = {"tool_calls": 2.0, "tool_errors": 1.0, "correct": 1.0}
    g = TrajectoryGroup(Task("a"), (
        _traj("a", 0, 1.0, [0, 0, 1, 1], metrics=calls),
        _traj("a", 1, 0.0, [0, 0, 1, 1, 1, 1], stop=StopReason.MAX_TOKENS),
    ))  # fmt: skip
    m = rollout_metrics([g])
    assert m["rollout/reward_mean"] == 0.5 and m["rollout/reward_std"] == 0.5
    assert m["rollout/acc"] == 0.5  # the unscored episode counts as wrong
    assert m["rollout/response_len_mean"] == 3.0 and m["rollout/max_tokens_frac"] == 0.5
    assert m["rollout/tool_calls_mean"] == 1.0 and m["rollout/tool_error_rate"] == 0.5
    mm = mismatch_metrics(
        [torch.tensor([0.0, -1.0, -2.0])], [torch.tensor([9.0, -1.5, -1.0])],
        [torch.tensor([0.0, 1.0, 1.0])], tis_cap=2.0,
    )  # fmt: skip
    assert mm["mismatch/abs_diff_mean"] == pytest.approx(0.75)
    assert mm["mismatch/abs_diff_max"] == pytest.approx(1.0)
    assert mm["mismatch/tis_weight_max"] == pytest.approx(math.e)
    assert mm["mismatch/tis_capped_frac"] == pytest.approx(0.5)


def test_shards_cover_every_sequence_once() -> None:
    assert shard_indices([5, 9, 3], 1) == [[0, 1, 2]]
    parts = shard_indices([5, 9, 3, 7, 1, 2], 2)
    assert sorted(i for p in parts for i in p) == list(range(6)) and [len(p) for p in parts] == [
        3,
        3,
    ]
    assert shard_indices([4], 2) == [[0], []]


# ---------------------------------------------------------------------- the loop, scripted
def _logprob_gap(model: Any, tokenizer: Any, groups: Sequence[TrajectoryGroup]) -> float:
    """Mean response logprob of right answers minus wrong ones, under ``model``."""
    from agentloop.trainers.logprobs import token_logprobs
    from agentloop.trainers.packing import pack, train_seqs

    trajs = [t for g in groups for t in g.trajectories]
    seqs = train_seqs(trajs, [0.0] * len(trajs))
    with torch.no_grad():
        lps = pack(seqs).unpack(token_logprobs(model, pack(seqs)).logprobs)
    by = {True: [], False: []}  # type: dict[bool, list[float]]
    for t, lp, s in zip(trajs, lps, seqs, strict=True):
        by[t.reward > 0].append(float((lp * s.loss_mask).sum()))
    return sum(by[True]) / len(by[True]) - sum(by[False]) / len(by[False])


def test_grpo_steps_move_the_policy_towards_rewarded_answers(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(micro_model_dir)
    cfg = _config(micro_model_dir, tmp_path / "run")
    seen: list[StepInfo] = []

    async def on_step(info: StepInfo) -> None:
        seen.append(info)

    result = asyncio.run(train_async(cfg, engine=scripted_engine(tok), on_step=on_step))
    assert result.last_step == 2 and [i.step for i in seen] == [1, 2]
    m = read_metrics(tmp_path / "run")
    for step in (1, 2):
        assert 0 < m[step]["rollout/reward_mean"] < 1  # mixed groups: a learning signal
        assert m[step]["actor/pg_loss"] != 0 and m[step]["actor/grad_norm"] > 0
        assert m[step]["adv/abs_mean"] > 0 and m[step]["actor/updates"] == 1
        assert m[step]["timing_s/update_actor"] > 0 and m[step]["perf/tokens_per_s"] > 0
    before = AutoModelForCausalLM.from_pretrained(micro_model_dir, dtype=torch.float32)
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final", dtype=torch.float32)
    for info in seen:  # right answers gained on wrong ones, in every step's batch
        assert _logprob_gap(after, tok, info.groups) > _logprob_gap(before, tok, info.groups) + 1
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert ckpts == ["step_00000002"]  # keep_last=1
    assert (tmp_path / "run" / "trajectories" / "step_000002.jsonl").is_file()
    assert any((tmp_path / "run" / "tb").iterdir())


def test_a_replayed_run_gives_the_same_losses_and_grad_norms(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(micro_model_dir)
    original = _config(micro_model_dir, tmp_path / "a", "trainer.mini_batches=2")
    asyncio.run(train_async(original, engine=scripted_engine(tok)))
    replay = _config(micro_model_dir, tmp_path / "b", "trainer.mini_batches=2",
                     f"rollout.replay={tmp_path / 'a' / 'trajectories'}")  # fmt: skip
    asyncio.run(train_async(replay))  # no engine at all: nothing is generated
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    for step in (1, 2):
        for key in ("actor/loss", "actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-6, abs=1e-9), (step, key)
        assert b[step]["rollout/gen_rounds"] == 0


def test_dynamic_sampling_drops_constant_groups_and_samples_again(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(micro_model_dir)
    cfg = _config(micro_model_dir, tmp_path / "run", "trainer.total_steps=1",
                  "algorithm.dynamic_sampling=true", "checkpoint.export_final=false")  # fmt: skip
    engine = scripted_engine(tok, constant_even=True)
    seen: list[StepInfo] = []

    async def on_step(info: StepInfo) -> None:
        seen.append(info)

    asyncio.run(train_async(cfg, engine=engine, on_step=on_step))
    m = read_metrics(tmp_path / "run")[1]
    assert m["rollout/dropped_groups"] >= 1 and m["rollout/gen_rounds"] >= 2
    assert len(seen[0].groups) == cfg.trainer.prompts_per_step
    for g in seen[0].groups:
        assert len(set(g.rewards_G)) > 1
