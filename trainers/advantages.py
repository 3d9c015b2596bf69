"""The advantage estimators, one function each in a table by name (verl's definitions)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from agentloop.errors import ConfigError
from agentloop.trainers.choices import ADV_ESTIMATORS, ESTIMATOR_SPECS, TURN_ESTIMATORS
from agentloop.trainers.losses import kl_penalty
from agentloop.trainers.turn_advantages import turn_rloo_advantages
from agentloop.types import Trajectory, TrajectoryGroup

__all__ = [
    "ADV_ESTIMATORS",
    "ESTIMATORS",
    "TURN_ESTIMATORS",
    "AdvantageBatch",
    "Estimator",
    "KlInReward",
    "compute_advantages",
    "grpo",
    "kl_reward_penalty",
    "masked_whiten",
    "outcome_token_rewards",
    "reinforce_plus_plus",
    "rloo",
    "trajectory_advantages",
    "turn_rloo",
]


def outcome_token_rewards(rewards_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Token rewards ``[B, T]``: each outcome reward sits on its row's last loss token.

    A row without loss tokens gets no reward anywhere (it trains nothing either way).
    """
    m = mask_BT > 0
    positions = torch.arange(m.shape[1], device=m.device).expand_as(m)
    last_T = torch.where(m, positions, -1).amax(dim=1)
    out = torch.zeros(m.shape, dtype=rewards_B.dtype, device=rewards_B.device)
    rows = torch.nonzero(last_T >= 0).squeeze(1)
    out[rows, last_T[rows]] = rewards_B[rows]
    return out


def kl_reward_penalty(
    token_rewards_BT: torch.Tensor,
    logprob_BT: torch.Tensor,
    ref_logprob_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    coef: float,
    kind: str = "kl",
) -> torch.Tensor:
    """In-reward KL (verl ``apply_kl_penalty``): ``r_t - coef · kl_t`` on loss tokens."""
    kl = torch.where(mask_BT > 0, kl_penalty(logprob_BT, ref_logprob_BT, kind), 0.0)
    return token_rewards_BT - coef * kl


def masked_whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(x - mean) / sqrt(var + 1e-8)`` over masked entries, unbiased var (verl ``masked_whiten``).

    With fewer than two masked entries the variance is undefined; the result is then ``x - mean``
    (verl raises instead).
    """
    m = mask.to(x.dtype)
    n = m.sum()
    mean = (x * m).sum() / n.clamp(min=1.0)
    centered = x - mean
    if float(n) < 2:
        return centered
    var = (centered.square() * m).sum() / (n - 1)
    return centered * torch.rsqrt(var + 1e-8)


def _group_ids(
    group_index: Sequence[Hashable] | torch.Tensor, device: torch.device
) -> torch.Tensor:
    if isinstance(group_index, torch.Tensor):
        inverse: torch.Tensor
        _, inverse = torch.unique(group_index, return_inverse=True)
        return inverse.to(device)
    ids: dict[Hashable, int] = {}
    return torch.tensor([ids.setdefault(g, len(ids)) for g in group_index], device=device)


def _grpo_scores(scores_B: torch.Tensor, gid_B: torch.Tensor, o: AdvantageBatch) -> torch.Tensor:
    """``(R - mean_g) / (std_g + ε)``, unbiased std; ``R - mean_g`` without ``norm_by_std``."""
    count_G, mean_B, single_B = _group_stats(scores_B, gid_B)
    if not o.norm_by_std:
        return scores_B - mean_B
    sq_G = torch.zeros_like(count_G).index_add(0, gid_B, (scores_B - mean_B).square())
    std_B = torch.sqrt(sq_G / (count_G - 1).clamp(min=1))[gid_B]
    std_B = torch.where(single_B, 1.0, std_B)
    return (scores_B - mean_B) / (std_B + o.epsilon)


def _rloo_scores(scores_B: torch.Tensor, gid_B: torch.Tensor, o: AdvantageBatch) -> torch.Tensor:
    """``R`` minus the mean of the group's other samples; a lone sample keeps its reward."""
    count_G, mean_B, single_B = _group_stats(scores_B, gid_B)
    n_B = count_G[gid_B]
    # n/(n-1)·(r - mean) is r minus the mean of the other n-1
    return torch.where(single_B, scores_B, (scores_B - mean_B) * n_B / (n_B - 1).clamp(min=1))


def _group_stats(
    scores_B: torch.Tensor, gid_B: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each group's size ``[G]``, each row's group mean ``[B]`` (0 for a group of one) and
    whether its group is a single row ``[B]``."""
    num = int(gid_B.max()) + 1 if gid_B.numel() else 0
    count_G = torch.bincount(gid_B, minlength=num).to(scores_B.dtype)
    sum_G = torch.zeros(num, dtype=scores_B.dtype, device=scores_B.device).index_add(
        0, gid_B, scores_B
    )
    single_B = count_G[gid_B] == 1
    mean_B = torch.where(single_B, 0.0, (sum_G / count_G)[gid_B])
    return count_G, mean_B, single_B


def _discounted_returns(
    token_rewards_BT: torch.Tensor, m: torch.Tensor, gamma: float
) -> torch.Tensor:
    if gamma == 1.0:  # reverse cumulative sum; rewards off the mask are ignored, as in the loop
        return torch.flip(torch.cumsum(torch.flip(token_rewards_BT * m, [1]), 1), [1]) * m
    returns = torch.zeros_like(token_rewards_BT)
    running = torch.zeros_like(token_rewards_BT[:, 0])
    for t in reversed(range(token_rewards_BT.shape[1])):
        keep = m[:, t] > 0
        # observation tokens (mask 0) neither discount nor reset the return
        running = torch.where(keep, token_rewards_BT[:, t] + gamma * running, running)
        returns[:, t] = torch.where(keep, running, 0.0)
    return returns


@dataclass(frozen=True)
class AdvantageBatch:
    """What an estimator reads: rows are trajectories (or a tensor batch's rows).

    ``token_rewards_BT``: each row's reward per token (the outcome on its last loss token, less
    any in-reward KL); ``mask_BT``: 1.0 on loss tokens, else 0.0; ``group_B``: each row's group
    (prompt), ``0..G-1``. ``groups``: the trajectories behind the rows, in order, when the batch
    comes from :func:`trajectory_advantages` (``None`` from :func:`compute_advantages`);
    ``kl_in_reward``: whether ``token_rewards_BT`` carries a KL penalty."""

    token_rewards_BT: torch.Tensor
    mask_BT: torch.Tensor
    group_B: torch.Tensor
    norm_by_std: bool = True
    epsilon: float = 1e-6
    gamma: float = 1.0
    groups: Sequence[TrajectoryGroup] | None = None
    kl_in_reward: bool = False


#: An estimator: advantages ``[B, T]`` (zero off the mask) of a batch.
Estimator = Callable[[AdvantageBatch], torch.Tensor]
_Scores = Callable[[torch.Tensor, torch.Tensor, AdvantageBatch], torch.Tensor]


def grpo(b: AdvantageBatch) -> torch.Tensor:
    """``(R - mean_g) / (std_g + ε)`` with the unbiased std of the group, or ``R - mean_g`` with
    ``norm_by_std=False`` (Dr.GRPO); a group of size 1 uses mean 0, std 1."""
    return _group_outcome(b, _grpo_scores)


def rloo(b: AdvantageBatch) -> torch.Tensor:
    """``R - mean of the other samples`` of the group (size 1: ``R``)."""
    return _group_outcome(b, _rloo_scores)


def reinforce_plus_plus(b: AdvantageBatch) -> torch.Tensor:
    """The discounted return over loss tokens (``gamma``), whitened over every loss token of the
    batch (so compute it on the whole batch, before any DP split). verl resets the return at
    every mask-0 token; here observation tokens are skipped instead, so earlier turns still see
    the final reward — identical to verl on single-turn data."""
    returns = _discounted_returns(b.token_rewards_BT, b.mask_BT, b.gamma)
    return masked_whiten(returns, b.mask_BT) * b.mask_BT


def turn_rloo(b: AdvantageBatch) -> torch.Tensor:
    """Per-turn credit from each turn's reward (:func:`turn_rloo_advantages`)."""
    if b.groups is None:
        raise ValueError("turn_rloo needs the trajectories (trajectory_advantages)")
    per_traj = turn_rloo_advantages(
        b.groups, norm_by_std=b.norm_by_std, epsilon=b.epsilon, gamma=b.gamma
    )
    out = torch.zeros_like(b.mask_BT)
    for i, a in enumerate(per_traj):
        out[i, : a.shape[0]] = a
    return out


#: The advantage estimators by name (``algorithm.adv_estimator``). A new one is a function here
#: and a row in this table and in ``trainers/choices.py``'s ``ESTIMATOR_SPECS`` (what the config
#: checks of it); ``docs/guides/training.md`` ("Adding an estimator") walks through it.
ESTIMATORS: dict[str, Estimator] = {
    "grpo": grpo,
    "rloo": rloo,
    "reinforce_plus_plus": reinforce_plus_plus,
    "turn_rloo": turn_rloo,
}


def _estimator(mode: str) -> Estimator:
    if mode not in ESTIMATORS:
        raise ConfigError(
            f"adv_estimator {mode!r} is not one of {ADV_ESTIMATORS}; pick one of those"
        )
    return ESTIMATORS[mode]


def _group_outcome(b: AdvantageBatch, scores: _Scores) -> torch.Tensor:
    """A group-baseline outcome estimator: each row's score from its reward ``R`` (the sum of
    its token rewards) on its loss tokens. When episodes are split into several trajectories
    (and no KL is in the reward), each episode counts once in its group's statistics."""
    if b.groups is not None and not b.kl_in_reward and _split_episodes(b.groups):
        return _episode_outcome_advantages(b, scores)
    return scores(b.token_rewards_BT.sum(dim=-1), b.group_B, b)[:, None] * b.mask_BT


@torch.no_grad()
def compute_advantages(
    mode: str,
    token_rewards_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    group_index: Sequence[Hashable] | torch.Tensor,
    *,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
    gamma: float = 1.0,
) -> torch.Tensor:
    """Advantages ``[B, T]`` (zero off the mask) from token rewards, verl's formulas: the
    estimator ``mode`` of :data:`ESTIMATORS` (:func:`grpo`, :func:`rloo`,
    :func:`reinforce_plus_plus`). ``group_index`` names each row's group (prompt). A per-turn
    estimator needs the turns: :func:`trajectory_advantages`."""
    estimator = _estimator(mode)
    if mode in TURN_ESTIMATORS:
        raise ConfigError(
            f"adv_estimator {mode!r} credits turns, which token rewards do not have; pick one "
            f"of {tuple(m for m in ADV_ESTIMATORS if m not in TURN_ESTIMATORS)}, or use "
            "trajectory_advantages"
        )
    m = (mask_BT > 0).to(token_rewards_BT.dtype)
    gid_B = _group_ids(group_index, token_rewards_BT.device)
    if ESTIMATOR_SPECS[mode].group_baseline and gid_B.shape[0] != token_rewards_BT.shape[0]:
        raise ValueError(
            f"group_index has {gid_B.shape[0]} entries for {token_rewards_BT.shape[0]} rows"
        )
    batch = AdvantageBatch(token_rewards_BT, m, gid_B, norm_by_std, epsilon, gamma)
    return estimator(batch)


def _split_episodes(groups: Sequence[TrajectoryGroup]) -> bool:
    """Whether an episode of some group is several trajectories (one ``sample_index``):
    ``rollout.thinking=strip`` samples, or a proxied agent's segments."""
    return any(len({t.sample_index for t in g.trajectories}) < len(g.trajectories) for g in groups)


def _episode_outcome_advantages(b: AdvantageBatch, scores: _Scores) -> torch.Tensor:
    """Outcome scores when episodes are split into several trajectories: the group's
    statistics count each episode once, with its reward (which every one of its trajectories
    carries), and each trajectory gets its episode's score on its own loss tokens. Counting
    samples instead would weigh an episode by how many turns it split into."""
    assert b.groups is not None
    episode_of: list[int] = []  # per trajectory, flattened: its episode's position
    rewards: list[float] = []
    group_of: list[int] = []
    seen: dict[tuple[int, int], int] = {}
    for gi, g in enumerate(b.groups):
        for t in g.trajectories:
            key = (gi, t.sample_index)
            if key not in seen:
                seen[key] = len(rewards)
                rewards.append(t.reward)
                group_of.append(gi)
            episode_of.append(seen[key])
    gid = _group_ids(group_of, torch.device("cpu"))
    per_episode = scores(torch.tensor(rewards), gid, b)
    return per_episode[torch.tensor(episode_of)][:, None] * b.mask_BT


@dataclass(frozen=True)
class KlInReward:
    """verl's ``use_kl_in_reward``: each loss token's reward loses ``coef·KL(logprobs ‖ ref)``.

    ``logprobs``/``ref_logprobs`` hold one ``[L_i]`` tensor per trajectory that
    :func:`trajectory_advantages` returns (its ``keep``), in that order.
    """

    coef: float
    kind: str
    logprobs: Sequence[torch.Tensor]
    ref_logprobs: Sequence[torch.Tensor]


def trajectory_advantages(
    groups: Sequence[TrajectoryGroup],
    mode: str,
    *,
    keep: Sequence[int] | None = None,
    kl: KlInReward | None = None,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
    gamma: float = 1.0,
) -> list[torch.Tensor]:
    """Per-token advantages ``[L_i]`` (float32) of trajectories ``keep`` (indices into the
    groups' trajectories flattened in order; default all), by the estimator ``mode`` of
    :data:`ESTIMATORS`.

    Rewards are outcome rewards (``Trajectory.reward``) placed on the last loss token; positions
    with ``loss_mask`` 0 (prompt, observations) get 0. Group statistics use every trajectory of a
    group, kept or not (a failed one scores its reward, 0), as in verl.
    ``turn_rloo`` uses each turn's reward instead (:func:`turn_rloo_advantages`). With
    ``grpo``/``rloo``, an episode split into several trajectories counts once in its group's
    statistics (:func:`_episode_outcome_advantages`).
    """
    estimator = _estimator(mode)
    if kl is not None and ESTIMATOR_SPECS[mode].per_turn:
        raise ConfigError(
            f"adv_estimator={mode} does not take KL in the reward; use actor.kl_coef (KL "
            "as a loss term) instead of algorithm.use_kl_in_reward"
        )
    trajs = [t for g in groups for t in g.trajectories]
    rows = range(len(trajs)) if keep is None else keep
    if not trajs:
        return []
    mask_BT = _loss_masks(trajs)
    rewards_B = torch.tensor([t.reward for t in trajs], dtype=torch.float32)
    token_rewards_BT = outcome_token_rewards(rewards_B, mask_BT)
    if kl is not None:
        token_rewards_BT = _with_kl(token_rewards_BT, mask_BT, rows, kl)
    index = [gi for gi, g in enumerate(groups) for _ in g.trajectories]
    batch = AdvantageBatch(
        token_rewards_BT,
        mask_BT,
        _group_ids(index, mask_BT.device),
        norm_by_std,
        epsilon,
        gamma,
        groups=groups,
        kl_in_reward=kl is not None,
    )
    adv = estimator(batch)
    return [adv[i, : len(trajs[i].token_ids)].clone() for i in rows]


def _loss_masks(trajs: Sequence[Trajectory]) -> torch.Tensor:
    """The trajectories' loss masks ``[B, T]`` (float32), padded with 0 to the longest."""
    width = max(len(t.token_ids) for t in trajs)
    mask_BT = torch.zeros(len(trajs), width)
    for i, t in enumerate(trajs):
        mask_BT[i, : len(t.loss_mask)] = torch.tensor(t.loss_mask, dtype=torch.float32)
    return mask_BT


def _with_kl(
    token_rewards_BT: torch.Tensor, mask_BT: torch.Tensor, rows: Sequence[int], kl: KlInReward
) -> torch.Tensor:
    """The token rewards less the KL penalty of rows ``rows`` (the others have no logprobs)."""
    lp_BT, ref_BT = torch.zeros_like(mask_BT), torch.zeros_like(mask_BT)
    for j, i in enumerate(rows):
        lp_BT[i, : len(kl.logprobs[j])] = kl.logprobs[j]
        ref_BT[i, : len(kl.ref_logprobs[j])] = kl.ref_logprobs[j]
    return kl_reward_penalty(token_rewards_BT, lp_BT, ref_BT, mask_BT, kl.coef, kl.kind)
