"""The turn-level estimator (``turn_rloo``): hand values, unbiasedness for each action's value per
turn position under random turn counts, per-token placement, and GRPO steps that train with it."""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from agentloop.engines.base import SamplingParams
from agentloop.engines.fake import FakeEngine
from agentloop.errors import AgentLoopError, ConfigError
from agentloop.trainers.advantages import trajectory_advantages
from agentloop.trainers.config import TrainConfig, load_config
from agentloop.trainers.grpo import train_async
from agentloop.trainers.metrics import read_metrics, rollout_metrics
from agentloop.trainers.turn_advantages import turn_returns, turn_rloo_scores
from agentloop.types import StopReason, Task, Trajectory, TrajectoryGroup, Turn


def test_hand_computed_values() -> None:
    assert turn_returns([0.0, 1.0, 2.0], gamma=0.5) == [0.0 + 0.5 * (1 + 0.5 * 2), 2.0, 2.0]
    # returns G: episode a (3 turns) [1, 2, 3], b (2 turns) [3, 0], c (1 turn) [5]
    scores = turn_rloo_scores([[1.0, 2.0, 3.0], [3.0, 0.0], [5.0]])
    # turn 0: a 1 - mean(3, 5) = -3; b 3 - mean(1, 5) = 0; c 5 - mean(1, 3) = 3
    # turn 1: a 2 - 0 = 2; b 0 - 2 = -2; turn 2: only a reached it -> 0 (no baseline)
    assert scores == [[-3.0, 2.0, 0.0], [0.0, -2.0], [3.0]]
    normed = turn_rloo_scores([[1.0, 2.0, 3.0], [3.0, 0.0], [5.0]], norm_by_std=True, epsilon=0)
    assert normed[0][0] == pytest.approx(-3.0 / 2.0)  # std(1, 3, 5) = 2
    assert normed[1][1] == pytest.approx(-2.0 / 2**0.5)  # std(2, 0) = sqrt(2)


def _traj(task: str, i: int, turn_rewards: Sequence[float], lens: Sequence[int]) -> Trajectory:
    """A prompt of 2 tokens, then per turn ``lens[k]`` sampled tokens and 1 observation token."""
    turns, mask, pos = [], [0, 0], 2
    for k, (r, n) in enumerate(zip(turn_rewards, lens, strict=True)):
        turns.append(Turn(k, pos, n, 1, "stop", reward=r))
        mask += [1] * n + [0]
        pos += n + 1
    n = len(mask)
    return Trajectory(task, tuple(range(n)), tuple(mask), (0.0,) * n, 2, sum(turn_rewards),
                      StopReason.DONE, turns=tuple(turns), sample_index=i)  # fmt: skip


def test_each_turn_gets_its_advantage_on_its_sampled_tokens_only() -> None:
    a, b = _traj("t", 0, [0.0, 1.0], [2, 3]), _traj("t", 1, [0.0, 0.0], [1, 1])
    adv = trajectory_advantages(
        [TrajectoryGroup(Task("t"), (a, b))], "turn_rloo", norm_by_std=False
    )
    # G_a = [1, 1], G_b = [0, 0]: a +1 on both turns, b -1
    assert adv[0].tolist() == [0, 0, 1, 1, 0, 1, 1, 1, 0]
    assert adv[1].tolist() == [0, 0, -1, 0, -1, 0]
    with pytest.raises(ConfigError, match="turn_rloo"):  # a token-level formula has no turns
        from agentloop.trainers.advantages import compute_advantages

        compute_advantages("turn_rloo", torch.zeros(1, 2), torch.ones(1, 2), [0])


#: Per action, the mean reward of each turn: action 1 ends after 2 turns, action 0 after 4.
TURN_MEANS = {1: (1.0, 2.0), 0: (0.5, 0.5, 0.5, 0.5)}


def _true_advantage(action: int, k: int) -> float:
    """E[G_k | action] − E[G_k] over the episodes that reach turn k (gamma 1, actions 50/50)."""
    g = {a: sum(means[k:]) for a, means in TURN_MEANS.items() if k < len(means)}
    return g[action] - sum(g.values()) / len(g)


def test_each_turn_advantage_is_unbiased_for_its_actions_value_under_random_turn_counts() -> None:
    """Groups of 4 episodes whose first action decides how many turns they get. At each turn
    position the estimator's mean advantage given the action must equal the action's true
    advantage there (within 4 standard errors); the naive baseline (all turns of the group
    pooled) misses it by far, and so would a baseline that includes the episode itself
    (shrunk by 3/4): the check can fail."""
    rng = random.Random(0)
    ours: dict[tuple[int, int], list[float]] = {}
    pooled: dict[tuple[int, int], list[float]] = {}
    for _ in range(10000):
        actions = [rng.randint(0, 1) for _ in range(4)]
        rewards = [[rng.gauss(m, 1.0) for m in TURN_MEANS[a]] for a in actions]
        returns = [turn_returns(r) for r in rewards]
        flat = [x for g in returns for x in g]
        for a, g, s in zip(actions, returns, turn_rloo_scores(returns), strict=True):
            for k, (x, adv) in enumerate(zip(g, s, strict=True)):
                ours.setdefault((a, k), []).append(adv)
                pooled.setdefault((a, k), []).append(x - statistics.fmean(flat))
    for (a, k), values in sorted(ours.items()):
        want, got = _true_advantage(a, k), statistics.fmean(values)
        se = statistics.stdev(values) / len(values) ** 0.5
        assert abs(got - want) < 4 * se, (a, k, got, want, se)
        if k == 0:  # a self-including baseline (3/4 of ours) would be caught
            assert abs(0.75 * want - want) > 6 * se, (a, k, want, se)
    naive = statistics.fmean(pooled[(1, 0)])
    assert abs(naive - _true_advantage(1, 0)) > 0.3, naive  # biased by the turn count


def test_turn_rewards_are_recorded_and_reported() -> None:
    a, b = _traj("t", 0, [0.0, 1.0], [2, 3]), _traj("t", 1, [0.5], [1])
    m = rollout_metrics([TrajectoryGroup(Task("t"), (a, b))])
    assert a.turn_rewards == (0.0, 1.0)
    assert m["rollout/turn_reward/0"] == 0.25 and m["rollout/turn_reward/1"] == 1.0
    assert m["rollout/tool_episode_frac"] == 0.0 and m["rollout/turns_mean"] == 1.5


def test_an_episode_split_into_samples_counts_once_in_its_groups_outcome_statistics() -> None:
    """``thinking=strip`` (or proxy segments): episode a is three samples with reward 1, b one
    with reward 0. GRPO's group mean is over episodes (0.5), not samples (0.75)."""
    a = [_traj("t", 0, [1.0], [2]) for _ in range(3)]
    b = _traj("t", 1, [0.0], [2])
    group = [TrajectoryGroup(Task("t"), (*a, b))]
    for mode, want_a, want_b in (("grpo", 0.5, -0.5), ("rloo", 1.0, -1.0)):
        adv = trajectory_advantages(group, mode, norm_by_std=False)
        for sample in adv[:3]:
            assert sample.tolist() == [0, 0, want_a, want_a, 0], mode
        assert adv[3].tolist() == [0, 0, want_b, want_b, 0], mode


# ---------------------------------------------------------------------- training runs
NUM_TASKS = 4
CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'


def _engine(tokenizer: Any, *, tools: bool) -> FakeEngine:
    """Calls the tool on the first turn (if ``tools``), then answers: right on even seeds."""
    from agentloop.envs.calc import make_calc_task

    answers = {t.data["prompt"]: t.data["answer"] for t in
               (make_calc_task("train", i) for i in range(NUM_TASKS))}  # fmt: skip

    def script(prompt_ids: Sequence[int], sampling: SamplingParams) -> str:
        text = tokenizer.decode(list(prompt_ids))
        if tools and "<tool_response>" not in text:
            return CALL
        answer = next(a for p, a in answers.items() if p in text)
        return f"\\boxed{{{answer}}}" if (sampling.seed or 0) % 2 == 0 else "\\boxed{0}"

    return FakeEngine(script, tokenizer=tokenizer, eos_token_id=2)


def _config(model: Path, out: Path, *extra: str) -> TrainConfig:
    return load_config(
        TrainConfig,
        None,
        [f"model.path={model}", f"trainer.out_dir={out}", f"data.num_train_tasks={NUM_TASKS}",
         "data.env_kwargs.sandbox=fake", "trainer.prompts_per_step=2", "rollout.n=4",
         "rollout.max_prompt_len=384", "rollout.max_response_len=96", "actor.device=cpu",
         "actor.max_tokens_per_micro_batch=2048", "logging.progress=false",
         "logging.wandb=false", "checkpoint.every=0", "checkpoint.export_final=false", *extra],
    )  # fmt: skip


def test_three_grpo_steps_with_turn_level_advantages(micro_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(micro_model_dir)
    cfg = _config(micro_model_dir, tmp_path / "run", "trainer.total_steps=3",
                  "algorithm.adv_estimator=turn_rloo", "algorithm.gamma=0.5",
                  "trainer.stop_without_tool_calls=1")  # fmt: skip
    result = asyncio.run(train_async(cfg, engine=_engine(tok, tools=True)))
    assert result.last_step == 3
    m = read_metrics(tmp_path / "run")
    for step in (1, 2, 3):
        assert m[step]["rollout/turns_mean"] == 2 and m[step]["rollout/tool_episode_frac"] == 1
        assert m[step]["rollout/turn_reward/0"] == 0 and 0 < m[step]["rollout/turn_reward/1"] < 1
        assert m[step]["adv/abs_mean"] > 0 and m[step]["actor/grad_norm"] > 0


def test_a_run_whose_policy_stopped_calling_tools_is_stopped(
    micro_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(micro_model_dir)
    cfg = _config(micro_model_dir, tmp_path / "run", "trainer.total_steps=3",
                  "trainer.stop_without_tool_calls=1")  # fmt: skip
    with pytest.raises(AgentLoopError, match=r"no episode called a tool.*stop_without_tool_calls"):
        asyncio.run(train_async(cfg, engine=_engine(tok, tools=False)))


def test_training_picks_the_tool_call_parser_from_the_models_template(
    micro_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``rollout.parser: auto`` (the default) in training: a model wearing the Llama 3 template
    gets the llama3 parser at start-up, so its ``<|python_tag|>`` calls reach the tool."""
    import shutil

    from transformers import AutoTokenizer

    from agentloop.testing.families import wear_family

    model = wear_family(micro_model_dir, "llama3", tmp_path / "llama3")
    shutil.copy(micro_model_dir / "model.safetensors", model / "model.safetensors")
    call = '<|python_tag|>{"name": "python", "parameters": {"code": "print(6 * 7)"}}<|eom_id|>'
    engine = FakeEngine(
        [call, "It is \\boxed{42}.<|eot_id|>"], tokenizer=AutoTokenizer.from_pretrained(model)
    )
    cfg = _config(model, tmp_path / "run", "trainer.total_steps=1")
    assert asyncio.run(train_async(cfg, engine=engine)).last_step == 1
    assert "tool-call parser llama3" in capsys.readouterr().out
    m = read_metrics(tmp_path / "run")[1]
    assert m["rollout/tool_episode_frac"] == 1 and m["rollout/tool_error_rate"] == 0, m
