"""Eval statistics against hand-computed values: pass@k, t intervals, majority vote, bootstrap."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop.errors import ConfigError
from agentloop.stats import (
    majority_vote,
    mean_ci,
    mean_pass_at_k,
    paired_bootstrap,
    pass_at_k,
    pass_at_k_values,
    t_quantile,
)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 1, 0.25),
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (4, 0, 1, 0.0),
        (4, 0, 4, 0.0),
        (4, 4, 1, 1.0),
        (4, 4, 4, 1.0),
        (8, 1, 8, 1.0),  # any k-subset of all n samples contains the success
        (10, 3, 5, 1 - math.comb(7, 5) / math.comb(10, 5)),
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_hand_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@given(
    st.integers(1, 40).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
    )
)
def test_pass_at_k_matches_the_binomial_formula(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-9)


def test_pass_at_1_is_the_success_rate_and_grows_with_k() -> None:
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    values = [pass_at_k(8, 3, k) for k in range(1, 9)]
    assert values == sorted(values)


def test_pass_at_k_rejects_bad_counts() -> None:
    for n, c, k in [(4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)]:
        with pytest.raises(ConfigError, match="pass@k"):
            pass_at_k(n, c, k)


def test_mean_pass_at_k_skips_tasks_with_too_few_samples() -> None:
    assert mean_pass_at_k([(4, 1), (4, 2)], 1) == pytest.approx((0.25 + 0.5) / 2)
    assert mean_pass_at_k([(4, 2), (1, 1)], 2) == pytest.approx(5 / 6)
    assert math.isnan(mean_pass_at_k([(1, 1)], 2))


def test_pass_at_k_values() -> None:
    assert pass_at_k_values(1) == [1]
    assert pass_at_k_values(8) == [1, 2, 4, 8]
    assert pass_at_k_values(6) == [1, 2, 4, 6]
    assert pass_at_k_values(200)[-2:] == [128, 200]


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [(0.975, 1, 12.7062), (0.975, 4, 2.7764), (0.975, 10, 2.2281), (0.975, 30, 2.0423),
     (0.995, 5, 4.0321), (0.95, 20, 1.7247), (0.025, 10, -2.2281)],
)  # fmt: skip
def test_t_quantile_table_values(p: float, df: int, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, abs=1e-4)


def test_mean_ci_hand_computed() -> None:
    # mean 2, sample sd 1 (values 1, 2, 3), n = 3: half width t(0.975, 2) * 1 / sqrt(3).
    est = mean_ci([1.0, 2.0, 3.0])
    half = 4.302653 / math.sqrt(3)
    assert (est.mean, est.n) == (2.0, 3)
    assert est.lo == pytest.approx(2 - half, abs=1e-5)
    assert est.hi == pytest.approx(2 + half, abs=1e-5)


def test_mean_ci_degenerate_inputs() -> None:
    one = mean_ci([0.5])
    assert one.mean == 0.5 and math.isnan(one.lo) and math.isnan(one.hi)
    assert math.isnan(mean_ci([]).mean)
    same = mean_ci([1.0] * 5)
    assert (same.lo, same.hi) == (1.0, 1.0)
    assert mean_ci([0, 1] * 50, confidence=0.99).hi > mean_ci([0, 1] * 50, confidence=0.9).hi
    with pytest.raises(ConfigError, match="confidence"):
        mean_ci([1.0, 2.0], confidence=95)


def test_mean_ci_covers_the_true_mean_about_95_percent_of_the_time() -> None:
    import random

    rng = random.Random(0)
    trials, covered = 400, 0
    for _ in range(trials):
        est = mean_ci([rng.gauss(1.0, 2.0) for _ in range(8)])
        covered += est.lo <= 1.0 <= est.hi
    assert 0.92 <= covered / trials <= 0.98


def test_majority_vote() -> None:
    assert majority_vote(["3", "4", "4", None]) == "4"
    assert majority_vote(["5", "6"]) == "5"  # tie: the answer seen first
    assert majority_vote([None, "7", "6", "6", "7"]) == "7"
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None


def test_paired_bootstrap_finds_a_clear_improvement() -> None:
    diffs = [0.1, 0.2, 0.3, 0.0, 0.4] * 10
    res = paired_bootstrap(diffs, seed=1)
    assert res.mean_diff == pytest.approx(0.2)
    assert 0 < res.lo < 0.2 < res.hi
    assert res.p_value < 0.01
    assert res.n == 50


def test_paired_bootstrap_no_effect_and_reproducibility() -> None:
    diffs = [0.5, -0.5, 0.25, -0.25, 0.0, 0.13, -0.07, 0.31, -0.29, 0.02] * 3
    res = paired_bootstrap(diffs, seed=3)
    assert res.lo < 0 < res.hi
    assert res.p_value > 0.5
    assert paired_bootstrap(diffs, seed=3) == res
    assert paired_bootstrap(diffs, seed=4) != res


def test_paired_bootstrap_ci_narrows_with_more_tasks() -> None:
    base = [1.0, 0.0, 0.0, 1.0, 0.5]
    small, large = paired_bootstrap(base * 4, seed=0), paired_bootstrap(base * 40, seed=0)
    assert large.hi - large.lo < small.hi - small.lo


def test_paired_bootstrap_needs_two_tasks() -> None:
    with pytest.raises(ConfigError, match="paired tasks"):
        paired_bootstrap([0.3])
