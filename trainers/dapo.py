"""DAPO: dynamic-sampling group filter and overlong reward shaping (verl's definitions)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentloop.errors import ConfigError
from agentloop.types import Trajectory, TrajectoryGroup

__all__ = [
    "FilterStats",
    "accumulate_groups",
    "apply_overlong_penalty",
    "filter_groups",
    "informative_groups_mask",
    "overlong_penalty",
]


@dataclass(frozen=True, slots=True)
class FilterStats:
    """What one dynamic-sampling filter pass kept and dropped (groups and trajectories)."""

    kept_groups: int
    dropped_groups: int
    kept_trajectories: int
    dropped_trajectories: int


def informative_groups_mask(rewards_NG: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool: True where a group's rewards ``[N, G]`` are not all equal, or ``G == 1``."""
    if rewards_NG.shape[1] <= 1:
        return torch.ones(rewards_NG.shape[0], dtype=torch.bool, device=rewards_NG.device)
    return rewards_NG.amax(dim=1) != rewards_NG.amin(dim=1)


def _metric_values(group: TrajectoryGroup, metric: str) -> list[float]:
    if metric == "reward":
        return list(group.rewards_G)
    values = []
    for t in group.trajectories:
        if metric not in t.metrics:
            raise ConfigError(
                f"dynamic sampling metric {metric!r} is not in trajectory metrics "
                f"{sorted(t.metrics)} of task {t.task_id!r}; use 'reward' or one of those"
            )
        values.append(float(t.metrics[metric]))
    return values


def filter_groups(
    groups: Sequence[TrajectoryGroup], *, metric: str = "reward"
) -> tuple[list[TrajectoryGroup], FilterStats]:
    """Drop groups whose ``metric`` is the same for every sample (zero advantage, no signal).

    Like verl, a group of a single sample is kept. Values are compared exactly (a float std can
    be a rounding-level non-zero for equal values). ``metric`` is ``"reward"`` or a key of
    ``Trajectory.metrics`` (e.g. ``"acc"``).
    """
    kept = [g for g in groups if len(g) <= 1 or len(set(_metric_values(g, metric))) > 1]
    kept_ids = {id(g) for g in kept}
    dropped = [g for g in groups if id(g) not in kept_ids]
    stats = FilterStats(
        kept_groups=len(kept),
        dropped_groups=len(dropped),
        kept_trajectories=sum(len(g) for g in kept),
        dropped_trajectories=sum(len(g) for g in dropped),
    )
    return kept, stats


def accumulate_groups(
    buffer: Sequence[TrajectoryGroup],
    new_groups: Sequence[TrajectoryGroup],
    *,
    target_groups: int,
    rounds: int,
    max_rounds: int,
    metric: str = "reward",
) -> tuple[list[TrajectoryGroup] | None, list[TrajectoryGroup], FilterStats]:
    """One round of DAPO dynamic sampling: filter ``new_groups``, add them to ``buffer``.

    Returns ``(batch, buffer, stats)``: ``batch`` is the first ``target_groups`` informative
    groups once there are enough (the surplus is discarded, as in verl, and the buffer emptied),
    else ``None`` and the grown buffer: generate again. ``rounds`` counts generation rounds so far
    for this step (this one included); past ``max_rounds`` (``0`` = no cap) it raises.
    """
    kept, stats = filter_groups(new_groups, metric=metric)
    pool = [*buffer, *kept]
    if len(pool) >= target_groups:
        return pool[:target_groups], [], stats
    if 0 < max_rounds <= rounds:
        found = (
            f"dynamic sampling found {len(pool)} of {target_groups} groups with non-constant "
            f"{metric} after {rounds} generation rounds (algorithm.max_sampling_rounds="
            f"{max_rounds})"
        )
        if pool:  # some tasks do give a signal: more rounds find more of them
            raise ConfigError(
                f"{found}; the data are mostly too easy or too hard for the model: raise "
                "algorithm.max_sampling_rounds (0: no cap), or filter the dataset"
            )
        seen = sorted({v for g in new_groups for v in _metric_values(g, metric)}, key=str)
        raise ConfigError(
            f"{found}: within each group every sample scored the same {metric} (values seen: "
            f"{', '.join(map(str, seen[:4]))}), so more rounds will not help; the model solves "
            "none (or all) of these tasks. Start from a model that earns mixed rewards "
            "(model.path=tiny-calc rather than the random tiny), or set "
            "algorithm.dynamic_sampling=false to train on the groups as they come"
        )
    return None, pool, stats


def overlong_penalty(
    response_len: torch.Tensor | int,
    *,
    max_response_len: int,
    overlong_buffer: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    """DAPO soft overlong punishment: ``min(-(L - (L_max - buf)) / buf · factor, 0)``.

    Zero up to ``L_max - buf`` tokens, then linear down to ``-factor`` at ``L_max``.
    """
    if not 0 < overlong_buffer <= max_response_len:
        raise ConfigError(
            f"overlong_buffer {overlong_buffer} must be in (0, max_response_len="
            f"{max_response_len}]; DAPO uses a buffer of about a quarter of the max length"
        )
    length = torch.as_tensor(response_len, dtype=torch.float32)
    exceed = length - (max_response_len - overlong_buffer)
    return torch.clamp(-exceed / overlong_buffer * penalty_factor, max=0.0)


def apply_overlong_penalty(
    groups: Sequence[TrajectoryGroup],
    *,
    max_response_len: int,
    overlong_buffer: int,
    penalty_factor: float = 1.0,
) -> list[TrajectoryGroup]:
    """Groups whose trajectories' rewards include :func:`overlong_penalty`.

    The length is every token after the prompt (sampled and observation tokens, verl's
    ``valid_response_length``). The penalty is added to ``reward`` and recorded as
    ``metrics["overlong_penalty"]``.
    """

    def shaped(t: Trajectory) -> Trajectory:
        pen = float(
            overlong_penalty(
                len(t.response_ids),
                max_response_len=max_response_len,
                overlong_buffer=overlong_buffer,
                penalty_factor=penalty_factor,
            )
        )
        metrics = {**t.metrics, "overlong_penalty": pen}
        return dataclasses.replace(t, reward=t.reward + pen, metrics=metrics)

    return [
        TrajectoryGroup(task=g.task, trajectories=tuple(shaped(t) for t in g.trajectories))
        for g in groups
    ]
