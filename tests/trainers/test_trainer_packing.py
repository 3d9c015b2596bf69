"""Packing round-trips, padded batches, Karmarkar–Karp partitions and micro-batch budgets."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop.errors import ConfigError
from agentloop.trainers.packing import (
    TrainSeq,
    dp_partition,
    karmarkar_karp,
    loss_counts,
    make_micro_batches,
    micro_batch_partition,
    pack,
    pad,
    seq_workload,
    train_seqs,
)
from agentloop.types import StopReason, Trajectory


def _seq(n: int, seed: int, with_old: bool = False) -> TrainSeq:
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(n, generator=g) > 0.3).float()
    return TrainSeq(
        token_ids=torch.randint(0, 100, (n,), generator=g),
        loss_mask=mask,
        advantages=torch.randn(n, generator=g) * mask,
        rollout_logprobs=-torch.rand(n, generator=g),
        old_logprobs=-torch.rand(n, generator=g) if with_old else None,
    )


SEQS = [_seq(n, i, with_old=True) for i, n in enumerate([5, 1, 9, 3, 7])]


def test_pack_round_trip_and_layout() -> None:
    mb = pack(SEQS, [2, 0, 4])
    assert mb.input_ids.shape == (1, 21) and mb.num_seqs == 3 and mb.seq_index == (2, 0, 4)
    assert mb.cu_seqlens.tolist() == [0, 9, 14, 21] and mb.cu_seqlens.dtype == torch.int32
    assert mb.max_seqlen == 9
    assert mb.position_ids[0].tolist() == list(range(9)) + list(range(5)) + list(range(7))
    for field, src in [
        ("input_ids", "token_ids"),
        ("advantages", "advantages"),
        ("rollout_logprobs", "rollout_logprobs"),
        ("old_logprobs", "old_logprobs"),
    ]:
        parts = mb.unpack(getattr(mb, field))
        for part, i in zip(parts, mb.seq_index, strict=True):
            assert torch.equal(part, getattr(SEQS[i], src)), field
    # the loss mask is the input's, except each sequence's first token (no prediction)
    for part, i in zip(mb.unpack(mb.loss_mask), mb.seq_index, strict=True):
        expected = SEQS[i].loss_mask.clone()
        expected[0] = 0.0
        assert torch.equal(part, expected)
    assert mb.ref_logprobs is None


def test_pack_needs_all_or_none_of_old_logprobs() -> None:
    with pytest.raises(ValueError, match="some sequences have old_logprobs"):
        pack([SEQS[0], _seq(3, 9)])


def test_pad_matches_pack() -> None:
    pb = pad(SEQS, [2, 0], pad_token_id=7)
    mb = pack(SEQS, [2, 0])
    assert pb.input_ids.shape == (2, 9)
    assert (
        pb.input_ids[1, 5:].tolist() == [7] * 4
        and pb.attention_mask[1].tolist() == [1] * 5 + [0] * 4
    )
    valid = pb.attention_mask.bool()
    for field in ("input_ids", "loss_mask", "advantages", "rollout_logprobs", "old_logprobs"):
        assert torch.equal(getattr(pb, field)[valid], getattr(mb, field)[0]), field
    assert pb.loss_mask[~valid].sum() == 0


def test_train_seqs_from_trajectories() -> None:
    t = Trajectory(
        task_id="x",
        token_ids=(5, 6, 7, 8),
        loss_mask=(0, 1, 0, 1),
        logprobs=(0.0, -0.5, 0.0, -0.25),
        prompt_len=1,
        reward=1.0,
        stop_reason=StopReason.DONE,
    )
    (s,) = train_seqs([t], [2.0])
    assert s.token_ids.tolist() == [5, 6, 7, 8] and s.advantages.tolist() == [0.0, 2.0, 0.0, 2.0]
    assert s.rollout_logprobs.tolist() == [0.0, -0.5, 0.0, -0.25]
    (s2,) = train_seqs([t], [torch.tensor([0.0, 1.0, 0.0, 3.0])])
    assert s2.advantages.tolist() == [0.0, 1.0, 0.0, 3.0]


def test_karmarkar_karp_classic_and_deterministic() -> None:
    # the textbook LDM run: 8-7 -> 1, 6-5 -> 1, then 4, 1, 1 -> final difference 2 (14 | 16)
    parts = karmarkar_karp([4, 5, 6, 7, 8], 2)
    assert parts == [[0, 1, 3], [2, 4]]  # 4+5+7 = 16 | 6+8 = 14, heaviest part first
    assert parts == karmarkar_karp([4, 5, 6, 7, 8], 2)
    # ties break on index, so equal costs give one fixed answer
    assert karmarkar_karp([1, 1, 1, 1], 2) == karmarkar_karp([1, 1, 1, 1], 2)


def test_karmarkar_karp_equal_size() -> None:
    costs = [100, 1, 1, 1, 1, 1, 50, 50]
    parts = karmarkar_karp(costs, 2, equal_size=True)
    assert [len(p) for p in parts] == [4, 4]
    sums = sorted(sum(costs[i] for i in p) for p in parts)
    assert sums == [102, 103]  # the best 4/4 split
    with pytest.raises(ConfigError, match="7 sequences cannot be split into 2 equal-size parts"):
        karmarkar_karp(costs[:7], 2, equal_size=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=9), st.integers(1, 4))
def test_karmarkar_karp_partitions_and_is_near_optimal(costs: list[int], k: int) -> None:
    parts = karmarkar_karp(costs, k)
    assert len(parts) == k
    assert sorted(i for p in parts for i in p) == list(range(len(costs)))
    best = (
        min(
            max(sum(c for c, a in zip(costs, assign, strict=True) if a == j) for j in range(k))
            for assign in itertools.product(range(k), repeat=len(costs))
        )
        if len(costs) <= 7
        else None
    )
    got = max(sum(costs[i] for i in p) for p in parts)
    if best is not None:
        # LDM is a heuristic: within the largest item of the optimum (usually equal)
        assert got <= best + max(costs)


def test_dp_partition_balances_workload() -> None:
    lengths = [1000, 900, 100, 120, 80, 950, 60, 1010]
    parts = dp_partition(lengths, 2, linear_coef=0)
    assert [len(p) for p in parts] == [4, 4]
    work = seq_workload(lengths, linear_coef=0)
    sums = [sum(work[i] for i in p) for p in parts]
    assert max(sums) / min(sums) < 1.05
    assert parts == dp_partition(lengths, 2, linear_coef=0)


def test_seq_workload_is_linear_plus_quadratic() -> None:
    assert seq_workload([10, 100], linear_coef=5) == [150.0, 10500.0]


def test_micro_batches_respect_budget_and_oversized_rule() -> None:
    lengths = [30, 5, 12, 40, 8, 3, 25]
    parts = micro_batch_partition(lengths, 32)
    assert sorted(i for p in parts for i in p) == list(range(7))
    for p in parts:
        tokens = sum(lengths[i] for i in p)
        assert tokens <= 32 or p == [3]  # the 40-token sequence is alone
    assert [3] in parts
    # heaviest workload first
    work = seq_workload(lengths)
    loads = [sum(work[i] for i in p) for p in parts]
    assert loads == sorted(loads, reverse=True)
    assert parts == micro_batch_partition(lengths, 32)


def test_micro_batches_min_count_for_equal_counts_across_ranks() -> None:
    lengths = [4, 4, 4, 4]
    assert len(micro_batch_partition(lengths, 100)) == 1
    parts = micro_batch_partition(lengths, 100, min_num_micro_batches=3)
    assert len(parts) == 3
    with pytest.raises(ConfigError, match="min_num_micro_batches=5 exceeds the 4 sequences"):
        micro_batch_partition(lengths, 100, min_num_micro_batches=5)
    with pytest.raises(ConfigError, match="max_tokens_per_micro_batch must be >= 1, got 0"):
        micro_batch_partition(lengths, 0)


def test_make_micro_batches_and_loss_counts() -> None:
    mbs = make_micro_batches(SEQS, 10)
    assert sorted(i for mb in mbs for i in mb.seq_index) == list(range(5))
    assert all(mb.num_tokens <= 10 for mb in mbs)
    tokens, seqs = loss_counts(mbs)
    first_zeroed = [s.loss_mask.clone() for s in SEQS]
    for m in first_zeroed:
        m[0] = 0
    assert tokens == int(sum(m.sum() for m in first_zeroed))
    assert seqs == sum(int(m.any()) for m in first_zeroed)
    assert loss_counts([pad(SEQS)]) == (tokens, seqs)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=12),
    st.integers(1, 64),
    st.integers(1, 4),
)
def test_micro_batch_partition_properties(lengths: list[int], budget: int, min_count: int) -> None:
    min_count = min(min_count, len(lengths))
    parts = micro_batch_partition(lengths, budget, min_num_micro_batches=min_count)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert len(parts) >= min_count and all(parts)
    assert all(len(p) == 1 or sum(lengths[i] for i in p) <= budget for p in parts)
    assert parts == micro_batch_partition(lengths, budget, min_num_micro_batches=min_count)
