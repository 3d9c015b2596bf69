"""Advantage estimators against hand-computed numbers (verl's definitions)."""

from __future__ import annotations

import math

import pytest
import torch

from agentloop.errors import ConfigError
from agentloop.trainers.advantages import (
    KlInReward,
    compute_advantages,
    kl_reward_penalty,
    masked_whiten,
    outcome_token_rewards,
    trajectory_advantages,
)
from agentloop.types import StopReason, Task, Trajectory, TrajectoryGroup

# group "a": rewards 1, 0, 0, 1 (mean 0.5, unbiased std sqrt(1/3)); group "b": one sample, reward 2
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0])
INDEX = ["a", "a", "a", "a", "b"]
MASK = torch.tensor(
    [
        [0, 1, 1, 0],
        [0, 1, 0, 1],
        [1, 1, 1, 1],
        [0, 0, 1, 0],
        [0, 1, 1, 1],
    ],
    dtype=torch.float32,
)


def _adv(mode: str, **kw: object) -> torch.Tensor:
    return compute_advantages(mode, outcome_token_rewards(REWARDS, MASK), MASK, INDEX, **kw)  # type: ignore[arg-type]


def test_outcome_token_rewards_sit_on_last_loss_token() -> None:
    r = outcome_token_rewards(
        torch.tensor([1.0, 2.0, 3.0]), torch.tensor([[0, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 0]])
    )
    assert r.tolist() == [[0, 0, 1, 0], [0, 0, 2, 0], [0, 0, 0, 0]]


def test_grpo_group_mean_std_and_group_of_one() -> None:
    adv = _adv("grpo")
    s = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # 0.866024...
    expected_B = torch.tensor([s, -s, -s, s, 2.0 / (1.0 + 1e-6)])
    torch.testing.assert_close(adv, expected_B[:, None] * MASK)
    assert abs(s - 0.8660239) < 1e-6


def test_dr_grpo_skips_std() -> None:
    adv = _adv("grpo", norm_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, 2.0])[:, None] * MASK)


def test_grpo_constant_group_has_zero_advantage() -> None:
    m = torch.ones(3, 2)
    adv = compute_advantages("grpo", outcome_token_rewards(torch.ones(3), m), m, [0, 0, 0])
    assert torch.equal(adv, torch.zeros(3, 2))


def test_rloo_leave_one_out_baseline() -> None:
    adv = _adv("rloo")
    two_thirds = 2.0 / 3.0  # 1 - mean(1,0,0)... r - mean of the other three
    expected_B = torch.tensor([two_thirds, -two_thirds, -two_thirds, two_thirds, 2.0])
    torch.testing.assert_close(adv, expected_B[:, None] * MASK)


def test_reinforce_plus_plus_whitens_over_all_loss_tokens() -> None:
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 1, 1, 1, 0]], dtype=torch.float32)
    adv = compute_advantages(
        "reinforce_plus_plus", outcome_token_rewards(torch.tensor([1.0, 0.0]), mask), mask, [0, 1]
    )
    # returns: 1,1 | 0,0,0 -> mean 0.4, unbiased var (2·0.36 + 3·0.16)/4 = 0.3
    hi, lo = 0.6 / math.sqrt(0.3 + 1e-8), -0.4 / math.sqrt(0.3 + 1e-8)
    expected = torch.tensor([[0, hi, hi, 0, 0], [0, lo, lo, lo, 0]])
    torch.testing.assert_close(adv, expected)
    assert abs(hi - 1.0954451) < 1e-6 and abs(lo + 0.7302967) < 1e-6


def test_reinforce_plus_plus_discount_skips_observation_tokens() -> None:
    mask = torch.tensor([[0, 1, 0, 1]], dtype=torch.float32)  # token 2 is a tool observation
    rewards = outcome_token_rewards(torch.tensor([1.0]), mask)
    adv = compute_advantages("reinforce_plus_plus", rewards, mask, [0], gamma=0.5)
    # returns 0.5 (one loss token before the end) and 1; mean 0.75, unbiased var 0.125
    a = 0.25 / math.sqrt(0.125 + 1e-8)
    torch.testing.assert_close(adv, torch.tensor([[0.0, -a, 0.0, a]]))


def test_masked_whiten_with_one_token_centres_only() -> None:
    x = torch.tensor([[3.0, 5.0]])
    assert masked_whiten(x, torch.tensor([[0.0, 1.0]])).tolist() == [[-2.0, 0.0]]


def test_kl_reward_penalty_only_on_loss_tokens() -> None:
    r = torch.tensor([[0.0, 0.0, 1.0]])
    lp, ref = torch.tensor([[-1.0, -1.0, -1.0]]), torch.tensor([[-2.0, -1.5, -1.25]])
    out = kl_reward_penalty(r, lp, ref, torch.tensor([[0.0, 1.0, 1.0]]), coef=0.1, kind="k1")
    torch.testing.assert_close(out, torch.tensor([[0.0, -0.05, 1.0 - 0.025]]))


def test_unknown_estimator_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"'gae' is not one of .*grpo.*rloo"):
        _adv("gae")


def _traj(
    task: str, i: int, mask: tuple[int, ...], reward: float, stop: StopReason = StopReason.DONE
) -> Trajectory:
    return Trajectory(
        task_id=task,
        token_ids=tuple(range(len(mask))),
        loss_mask=mask,
        logprobs=tuple(-0.5 * m for m in mask),
        prompt_len=2,
        reward=reward,
        stop_reason=stop,
        sample_index=i,
    )


def test_trajectory_advantages_from_groups() -> None:
    g1 = TrajectoryGroup(
        task=Task(id="t1"),
        trajectories=(_traj("t1", 1, (0, 0, 1, 0, 1), 0.0), _traj("t1", 0, (0, 0, 1, 1), 1.0)),
    )
    g2 = TrajectoryGroup(task=Task(id="t2"), trajectories=(_traj("t2", 0, (0, 0, 1), 3.0),))
    advs = trajectory_advantages([g1, g2], "grpo", norm_by_std=False)
    # g1 is sorted by sample index: rewards (1, 0) -> +0.5, -0.5; g2 alone -> 3
    assert [a.tolist() for a in advs] == [
        [0.0, 0.0, 0.5, 0.5],
        [0.0, 0.0, -0.5, 0.0, -0.5],
        [0.0, 0.0, 3.0],
    ]


def test_kept_trajectories_use_whole_groups_and_kl_in_reward() -> None:
    group_a = TrajectoryGroup(
        task=Task(id="a"),
        trajectories=(
            _traj("a", 0, (0, 0, 1, 1), 1.0),
            _traj("a", 1, (0, 0, 1), 0.0),
            _traj("a", 2, (0, 0, 0), 0.0, StopReason.TIMEOUT),  # nothing to train, still scored
        ),
    )
    group_b = TrajectoryGroup(task=Task(id="b"), trajectories=(_traj("b", 0, (0, 0, 1), 2.0),))
    groups, keep = [group_a, group_b], [0, 1, 3]
    adv = trajectory_advantages(groups, "grpo", keep=keep)
    std = torch.tensor([1.0, 0.0, 0.0]).std().item()  # unbiased, as verl
    assert adv[0].tolist() == pytest.approx([0, 0, (2 / 3) / (std + 1e-6), (2 / 3) / (std + 1e-6)])
    assert adv[1][2].item() == pytest.approx((-1 / 3) / (std + 1e-6))
    assert adv[2].tolist() == pytest.approx([0.0, 0.0, 2.0 / (1 + 1e-6)])  # a group of one
    # KL in the reward: ref logprobs 1 below old on trained tokens, kl = old - ref = 1 per token
    old = [
        torch.zeros(len(t.token_ids)) for t in (*group_a.trajectories[:2], *group_b.trajectories)
    ]
    kl = KlInReward(coef=0.5, kind="kl", logprobs=old, ref_logprobs=[o - 1.0 for o in old])
    adv_kl = trajectory_advantages(groups, "grpo", keep=keep, kl=kl, norm_by_std=False)
    scores = torch.tensor([1.0 - 0.5 * 2, 0.0 - 0.5 * 1, 0.0])  # group a: rewards minus 0.5·tokens
    assert adv_kl[0][-1].item() == pytest.approx((scores[0] - scores.mean()).item())
    assert adv_kl[2][-1].item() == pytest.approx(2.0 - 0.5)


def test_every_estimator_has_a_function_and_a_spec() -> None:
    from agentloop.trainers.advantages import ESTIMATORS
    from agentloop.trainers.choices import ADV_ESTIMATORS, ESTIMATOR_SPECS

    assert list(ESTIMATORS) == list(ESTIMATOR_SPECS) == list(ADV_ESTIMATORS)
    assert all(callable(fn) for fn in ESTIMATORS.values())
