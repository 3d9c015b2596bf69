"""DAPO dynamic-sampling filter and overlong reward shaping."""

from __future__ import annotations

import pytest
import torch

from agentloop.errors import ConfigError
from agentloop.trainers.dapo import (
    accumulate_groups,
    apply_overlong_penalty,
    filter_groups,
    informative_groups_mask,
    overlong_penalty,
)
from agentloop.types import StopReason, Task, Trajectory, TrajectoryGroup


def _group(
    task: str, rewards: list[float], resp_len: int = 3, **metrics: list[float]
) -> TrajectoryGroup:
    trajs = tuple(
        Trajectory(
            task_id=task,
            token_ids=tuple(range(2 + resp_len)),
            loss_mask=(0, 0) + (1,) * resp_len,
            logprobs=(0.0, 0.0) + (-0.1,) * resp_len,
            prompt_len=2,
            reward=r,
            stop_reason=StopReason.DONE,
            sample_index=i,
            metrics={k: v[i] for k, v in metrics.items()},
        )
        for i, r in enumerate(rewards)
    )
    return TrajectoryGroup(task=Task(id=task), trajectories=trajs)


def test_filter_drops_constant_groups_and_keeps_singletons() -> None:
    groups = [
        _group("mixed", [1.0, 0.0, 1.0]),
        _group("all-right", [1.0, 1.0, 1.0]),
        _group("all-wrong", [0.0, 0.0]),
        _group("alone", [1.0]),
    ]
    kept, stats = filter_groups(groups)
    assert [g.task.id for g in kept] == ["mixed", "alone"]
    assert (stats.kept_groups, stats.dropped_groups) == (2, 2)
    assert (stats.kept_trajectories, stats.dropped_trajectories) == (4, 5)


def test_filter_compares_exactly() -> None:
    # 0.1 + 0.2 != 0.3 in floats: not constant; 0.3 three times is constant
    kept, _ = filter_groups([_group("a", [0.1 + 0.2, 0.3]), _group("b", [0.3, 0.3, 0.3])])
    assert [g.task.id for g in kept] == ["a"]


def test_filter_on_a_trajectory_metric() -> None:
    g = _group("t", [0.5, 0.7], acc=[1.0, 1.0])
    assert filter_groups([g])[0] == [g]
    assert filter_groups([g], metric="acc")[0] == []
    with pytest.raises(ConfigError, match=r"'score' is not in trajectory metrics \['acc'\]"):
        filter_groups([g], metric="score")


def test_informative_groups_mask_on_tensors() -> None:
    r = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    assert informative_groups_mask(r).tolist() == [True, False, False]
    assert informative_groups_mask(torch.tensor([[1.0], [1.0]])).tolist() == [True, True]


def test_accumulate_until_full_then_discard_surplus() -> None:
    a, b, c, flat = (
        _group("a", [1, 0]),
        _group("b", [0, 1]),
        _group("c", [1, 0]),
        _group("f", [1, 1]),
    )
    batch, buf, stats = accumulate_groups([], [a, flat], target_groups=2, rounds=1, max_rounds=3)
    assert batch is None and buf == [a] and stats.dropped_groups == 1
    batch, buf, _ = accumulate_groups(buf, [b, c], target_groups=2, rounds=2, max_rounds=3)
    assert batch == [a, b] and buf == []


def test_accumulate_raises_past_max_rounds() -> None:
    flat = _group("f", [1, 1])
    with pytest.raises(ConfigError, match=r"found 0 of 2 groups .* after 3 generation rounds"):
        accumulate_groups([], [flat], target_groups=2, rounds=3, max_rounds=3)
    # max_rounds=0: no cap
    assert accumulate_groups([], [flat], target_groups=2, rounds=99, max_rounds=0)[0] is None


def test_accumulate_names_the_fix_that_helps() -> None:
    """Groups that are all constant: more rounds cannot help, dynamic sampling off does; a few
    informative groups found: more rounds do."""
    flat = [_group("f", [0, 0]), _group("g", [0, 0])]
    with pytest.raises(
        ConfigError, match=r"values seen: 0\).*set algorithm\.dynamic_sampling=false"
    ):
        accumulate_groups([], flat, target_groups=2, rounds=3, max_rounds=3)
    some = [_group("a", [1, 0])]
    with pytest.raises(ConfigError, match=r"found 1 of 2 .* raise algorithm\.max_sampling_rounds"):
        accumulate_groups(some, flat, target_groups=2, rounds=3, max_rounds=3)


async def test_the_shipped_example_on_tiny_fails_naming_the_fix_and_runs_with_it() -> None:
    """``agentloop train grpo_calc_tiny model.path=tiny``: the random tiny model earns reward 0
    in every episode; with the example's dynamic sampling the step fails naming
    ``algorithm.dynamic_sampling=false``, and with it the step's batch is the groups played."""
    from agentloop.trainers.config import TrainConfig, example_config, load_config
    from agentloop.trainers.data import PromptSampler
    from agentloop.trainers.rollouts import GenContext, generate_batch

    async def tiny(tasks: list[Task], *, group_size: int, **_: object) -> list[TrajectoryGroup]:
        return [_group(t.id, [0.0] * group_size) for t in tasks]  # what tiny scores on Calc

    tasks = [Task(id=f"calc-{i}") for i in range(16)]
    shipped = ["model.path=tiny", "data.env_kwargs.sandbox=fake"]
    cfg = load_config(TrainConfig, example_config("grpo_calc_tiny"), shipped)
    assert cfg.algorithm.dynamic_sampling
    with pytest.raises(ConfigError, match=r"set algorithm\.dynamic_sampling=false to train"):
        await generate_batch(GenContext.of(cfg, tiny, PromptSampler(tasks)), 1)
    fixed = load_config(TrainConfig, example_config("grpo_calc_tiny"),
                        [*shipped, "algorithm.dynamic_sampling=false"])  # fmt: skip
    groups, _ = await generate_batch(GenContext.of(fixed, tiny, PromptSampler(tasks)), 1)
    assert len(groups) == fixed.trainer.prompts_per_step and all(len(g) == 8 for g in groups)


def test_overlong_penalty_linear_in_the_buffer() -> None:
    # max 20, buffer 4: free up to 16 tokens, then -0.25·factor per token
    lens = torch.tensor([10, 16, 17, 18, 20, 22])
    out = overlong_penalty(lens, max_response_len=20, overlong_buffer=4, penalty_factor=1.0)
    assert out.tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.5]
    half = overlong_penalty(18, max_response_len=20, overlong_buffer=4, penalty_factor=0.5)
    assert half.item() == -0.25


def test_overlong_penalty_rejects_bad_buffer() -> None:
    with pytest.raises(
        ConfigError, match=r"overlong_buffer 0 must be in \(0, max_response_len=20\]"
    ):
        overlong_penalty(5, max_response_len=20, overlong_buffer=0)


def test_apply_overlong_penalty_on_groups() -> None:
    groups = [_group("a", [1.0, 0.0], resp_len=18), _group("b", [1.0], resp_len=5)]
    shaped = apply_overlong_penalty(groups, max_response_len=20, overlong_buffer=4)
    assert [g.rewards_G for g in shaped] == [(0.5, -0.5), (1.0,)]
    assert shaped[0].trajectories[0].metrics["overlong_penalty"] == -0.5
    assert groups[0].rewards_G == (1.0, 0.0)  # inputs untouched
