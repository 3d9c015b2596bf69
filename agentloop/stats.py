"""Eval statistics as pure functions: pass@k, confidence intervals, majority vote, bootstrap."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from agentloop.errors import ConfigError

__all__ = [
    "BootstrapResult",
    "Estimate",
    "majority_vote",
    "mean_ci",
    "mean_pass_at_k",
    "paired_bootstrap",
    "pass_at_k",
    "pass_at_k_values",
    "t_quantile",
]

A = TypeVar("A", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Estimate:
    """A mean with a two-sided confidence interval ``[lo, hi]`` over ``n`` values.
    With fewer than two values the interval is unknown: ``lo`` and ``hi`` are NaN."""

    mean: float
    lo: float
    hi: float
    n: int
    confidence: float = 0.95


@dataclass(frozen=True, slots=True)
class BootstrapResult:
    """Mean paired difference ``b - a`` with a percentile bootstrap CI and a two-sided p-value
    (the share of null-centred resamples at least as far from 0 as the observed mean)."""

    mean_diff: float
    lo: float
    hi: float
    p_value: float
    n: int
    n_resamples: int
    confidence: float = 0.95


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with ``c`` successes in ``n`` samples (Chen et al. 2021):
    ``1 - C(n-c, k) / C(n, k)``, computed as a stable product."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ConfigError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean pass@k over tasks given as ``(n, c)``; tasks with fewer than ``k`` samples are left
    out. NaN when no task has ``k`` samples."""
    values = [pass_at_k(n, c, k) for n, c in counts if n >= k]
    return sum(values) / len(values) if values else math.nan


def pass_at_k_values(n: int) -> list[int]:
    """The ks reported for ``n`` samples per task: 1, 2, 4, … up to ``n``, and ``n`` itself."""
    if n < 1:
        raise ConfigError(f"pass@k needs n >= 1 samples per task, got {n}")
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return ks if ks[-1] == n else [*ks, n]


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> Estimate:
    """Mean with a Student-t confidence interval. For samples drawn in groups (several per task)
    pass the per-task means: samples of one task are not independent."""
    _check_confidence(confidence)
    n = len(values)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, confidence)
    mean = math.fsum(values) / n
    if n < 2:
        return Estimate(mean, math.nan, math.nan, n, confidence)
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = t_quantile(0.5 + confidence / 2, n - 1) * math.sqrt(var / n)
    return Estimate(mean, mean - half, mean + half, n, confidence)


def majority_vote(answers: Sequence[A | None]) -> A | None:
    """The most common non-None answer; ties go to the answer seen first. None if none."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


def paired_bootstrap(
    diffs: Sequence[float],
    *,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> BootstrapResult:
    """Bootstrap the mean of per-task paired differences ``diffs_T`` (b - a, one per task):
    resample tasks with replacement ``n_resamples`` times from ``numpy`` RNG ``seed``."""
    import numpy as np

    _check_confidence(confidence)
    if len(diffs) < 2 or n_resamples < 1:
        raise ConfigError(
            f"a paired bootstrap needs >= 2 paired tasks and >= 1 resample, got {len(diffs)} "
            f"tasks and n_resamples={n_resamples}; evaluate both runs on more of the same tasks"
        )
    d_T = np.asarray(diffs, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means_R = d_T[rng.integers(0, len(d_T), size=(n_resamples, len(d_T)))].mean(axis=1)
    alpha = (1.0 - confidence) / 2
    lo, hi = np.quantile(means_R, [alpha, 1.0 - alpha])
    observed = float(d_T.mean())
    # Null distribution: the resampled means shifted to centre on 0.
    extreme = np.abs(means_R - observed) >= abs(observed) - 1e-12
    p_value = (int(extreme.sum()) + 1) / (n_resamples + 1)
    return BootstrapResult(
        observed, float(lo), float(hi), min(p_value, 1.0), len(d_T), n_resamples, confidence
    )


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on the CDF)."""
    if not 0 < p < 1 or df < 1:
        raise ConfigError(f"t_quantile needs 0 < p < 1 and df >= 1, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def _t_cdf(t: float, df: int) -> float:
    """P(T <= t) for t >= 0: 1 - I_x(df/2, 1/2) / 2 with x = df / (df + t^2)."""
    return 1.0 - 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b), by its continued fraction (Lentz's method)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = a * math.log(x) + b * math.log1p(-x) - math.log(a)
    log_front -= math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast only below this point
        return 1.0 - _betainc(b, a, 1.0 - x)
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * f


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must be in (0, 1), e.g. 0.95; got {confidence}")
