"""Turn-level advantages: per-turn discounted returns, each compared with the same turn position
of the other episodes of its group (leave-one-out), so credit stays unbiased when turn counts vary.

The estimator (``algorithm.adv_estimator=turn_rloo``). For episode ``i`` of a group with turns
``k = 0..K_i-1`` and per-turn rewards ``r_ik`` (what ``env.step`` returned after turn ``k``):

    G_ik = sum_{j >= k} gamma^(j-k) r_ij                    (the return from turn k on)
    S_k  = {episodes of the group that reached turn k},  n_k = |S_k|
    A_ik = G_ik - mean_{j in S_k, j != i} G_jk             (n_k >= 2; else A_ik = 0)
    A_ik /= std_{j in S_k} G_jk + epsilon                  (only with norm_by_std)

and every token sampled in turn ``k`` gets ``A_ik`` (prompt and observation tokens get 0).

Why it is unbiased (with ``norm_by_std=false``). The policy gradient of turn ``k`` is
``E[grad log pi(turn_ik) * (G_ik - b)]``; it is unchanged by a baseline ``b`` that does not depend
on episode ``i``'s own actions. The episodes of a group are sampled independently given the
prompt, so the leave-one-out mean over the *other* episodes is such a baseline; and whether
another episode reached turn ``k`` depends only on that episode, so conditioning on ``S_k``
keeps the independence. The estimator is therefore unbiased for every turn position, whatever
the distribution of turn counts. The naive alternative — normalising all turns of a group
together — compares a turn-5 return (few rewards left to collect) with turn-0 returns, so late
turns get systematically negative advantages and early turns positive ones, and long episodes
(more turns in the pool) move everyone's baseline: biased exactly when turn counts vary.
Dividing by the per-position std (``norm_by_std``) rescales like GRPO; it uses episode ``i``'s
own return, which changes magnitudes but not the sign of any advantage.
A turn position reached by a single episode has no baseline and gets 0: it adds no gradient
(and no bias). Within a group, the advantages of each turn position sum to 0.

An episode given as several trajectories of one ``sample_index`` (``rollout.thinking=strip``:
one sample per turn; a proxied agent's segments) is one episode here: its turns, in order, are
``k = 0..K_i-1``, and each sample's tokens get the advantages of its own turns.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentloop.types import Trajectory, TrajectoryGroup

__all__ = ["turn_returns", "turn_rloo_advantages", "turn_rloo_scores"]


def turn_returns(rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """``G_k = r_k + gamma * G_{k+1}`` for one episode's per-turn rewards."""
    out, running = [0.0] * len(rewards), 0.0
    for k in reversed(range(len(rewards))):
        running = float(rewards[k]) + gamma * running
        out[k] = running
    return out


def turn_rloo_scores(
    returns: Sequence[Sequence[float]], *, norm_by_std: bool = False, epsilon: float = 1e-6
) -> list[list[float]]:
    """Advantages ``A_ik`` of one group from its episodes' per-turn returns ``G_ik`` (ragged)."""
    depth = max((len(g) for g in returns), default=0)
    out = [[0.0] * len(g) for g in returns]
    for k in range(depth):
        members = [i for i, g in enumerate(returns) if len(g) > k]
        n = len(members)
        if n < 2:
            continue
        values = torch.tensor([returns[i][k] for i in members], dtype=torch.float64)
        loo = (values - values.mean()) * n / (n - 1)  # G_ik - mean of the other n-1
        if norm_by_std:
            loo = loo / (values.std(unbiased=True) + epsilon)
        for i, a in zip(members, loo.tolist(), strict=True):
            out[i][k] = a
    return out


def _turn_rewards(t: Trajectory) -> list[float]:
    """The per-turn rewards; reward given outside ``env.step`` (DAPO's overlong shaping, a
    trajectory built by hand) belongs to the last turn, so the turns sum to ``t.reward``."""
    rewards = list(t.turn_rewards)
    if rewards:
        rewards[-1] += t.reward - sum(rewards)
    return rewards


def _token_advantages(t: Trajectory, per_turn: Sequence[float]) -> torch.Tensor:
    adv = torch.zeros(len(t.token_ids), dtype=torch.float32)
    for turn, a in zip(t.turns, per_turn, strict=True):
        adv[turn.start : turn.start + turn.completion_tokens] = a
    return adv * torch.tensor(t.loss_mask, dtype=torch.float32)


def turn_rloo_advantages(
    groups: Sequence[TrajectoryGroup],
    *,
    keep: Sequence[int] | None = None,
    norm_by_std: bool = False,
    epsilon: float = 1e-6,
    gamma: float = 1.0,
) -> list[torch.Tensor]:
    """Per-token advantages ``[L_i]`` of trajectories ``keep`` (indices into the groups'
    trajectories flattened in order; default all), as in the module docstring. Every
    trajectory of a group, kept or not, takes part in its turn positions' baselines.

    An episode may be several trajectories with one ``sample_index`` (``rollout.thinking=strip``:
    one per turn; a proxied agent's segments): their turns, in order, are the episode's turns,
    and each trajectory's tokens get the advantages of its own turns' positions."""
    per_traj: list[torch.Tensor] = []
    for g in groups:
        episodes: dict[int, list[Trajectory]] = {}
        for t in g.trajectories:
            episodes.setdefault(t.sample_index, []).append(t)
        parts = list(episodes.values())
        returns = [turn_returns(_episode_turn_rewards(p), gamma) for p in parts]
        scores = turn_rloo_scores(returns, norm_by_std=norm_by_std, epsilon=epsilon)
        by_traj: dict[int, list[float]] = {}
        for part, s in zip(parts, scores, strict=True):
            at = 0
            for t in part:
                by_traj[id(t)] = s[at : at + len(t.turns)]
                at += len(t.turns)
        per_traj += [_token_advantages(t, by_traj[id(t)]) for t in g.trajectories]
    rows = range(len(per_traj)) if keep is None else keep
    return [per_traj[i] for i in rows]


def _episode_turn_rewards(part: Sequence[Trajectory]) -> list[float]:
    """The per-turn rewards of an episode of one or more trajectories (each carries the
    episode's reward); reward outside ``env.step`` goes to its last turn, as in
    :func:`_turn_rewards`."""
    if len(part) == 1:
        return _turn_rewards(part[0])
    rewards = [r for t in part for r in t.turn_rewards]
    if rewards:
        rewards[-1] += part[-1].reward - sum(rewards)
    return rewards
