"""Same batch, any packing / micro-batch size / DP size -> same loss and same gradients."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from transformers import Qwen2ForCausalLM

from agentloop.trainers.logprobs import token_logprobs
from agentloop.trainers.losses import agg_loss, kl_penalty, policy_loss
from agentloop.trainers.packing import (
    MicroBatch,
    PaddedBatch,
    TrainSeq,
    dp_partition,
    loss_counts,
    make_micro_batches,
    micro_batch_partition,
    pack,
    pad,
)

LENGTHS = [7, 12, 4, 9, 15, 6]
NORM_LEN = 16  # seq-mean-token-sum-norm constant (the "max response length")


def _batch(model: torch.nn.Module) -> list[TrainSeq]:
    """Multi-turn-like sequences: prompt (mask 0), response, observation (mask 0), response."""
    g = torch.Generator().manual_seed(1)
    seqs = []
    for i, n in enumerate(LENGTHS):
        mask = torch.ones(n)
        mask[:2] = 0
        mask[n // 2 : n // 2 + 2] = 0
        seqs.append(
            TrainSeq(
                token_ids=torch.randint(0, 128, (n,), generator=g),
                loss_mask=mask,
                advantages=(1.0 if i % 2 else -0.7) * mask,
                rollout_logprobs=torch.zeros(n),
            )
        )
    mb = pack(seqs)
    with torch.no_grad():
        lp = token_logprobs(model, mb).logprobs
    out = []
    for s, old in zip(seqs, mb.unpack(lp), strict=True):
        noise = 0.3 * torch.randn(len(s), generator=g)
        out.append(
            dataclasses.replace(
                s,
                old_logprobs=old + noise,  # ratios away from 1, so some tokens clip
                rollout_logprobs=old + 0.5 * noise,
                ref_logprobs=old - noise,
            )
        )
    return out


def _loss(
    model: torch.nn.Module,
    b: MicroBatch | PaddedBatch,
    agg: str,
    pg_mode: str,
    counts: tuple[int, int],
) -> torch.Tensor:
    assert b.old_logprobs is not None and b.ref_logprobs is not None
    out = token_logprobs(model, b, with_entropy=True)
    assert out.entropy is not None
    cu = b.cu_seqlens if isinstance(b, MicroBatch) else None
    pg, _ = policy_loss(
        out.logprobs,
        b.old_logprobs,
        b.advantages,
        b.loss_mask,
        pg_mode,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        rollout_logprobs=b.rollout_logprobs,
        tis_cap=2.0,
        cu_seqlens=cu,
    )
    kw: dict[str, Any] = dict(
        cu_seqlens=cu, global_token_count=counts[0], global_seq_count=counts[1], norm_len=NORM_LEN
    )
    kl = kl_penalty(out.logprobs, b.ref_logprobs, "low_var_kl")
    return (
        agg_loss(pg, b.loss_mask, agg, **kw)
        + 0.1 * agg_loss(kl, b.loss_mask, agg, **kw)
        - 0.01 * agg_loss(out.entropy, b.loss_mask, agg, **kw)
    )


def _run(
    model: torch.nn.Module,
    ranks: Sequence[Sequence[MicroBatch | PaddedBatch]],
    agg: str,
    pg_mode: str,
) -> tuple[float, torch.Tensor]:
    """Every rank's micro-batches in turn, gradients accumulated (= summed over ranks, what an
    all-reduce SUM does), counts summed over ranks (what an all-reduce of loss_counts gives)."""
    model.zero_grad(set_to_none=True)
    per_rank = [loss_counts(r) for r in ranks]
    counts = (sum(c[0] for c in per_rank), sum(c[1] for c in per_rank))
    total = 0.0
    for rank in ranks:
        for b in rank:
            loss = _loss(model, b, agg, pg_mode, counts)
            loss.backward()
            total += loss.item()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return total, grads


def _dp_ranks(seqs: list[TrainSeq], dp: int, budget: int) -> list[list[MicroBatch]]:
    shards = dp_partition([len(s) for s in seqs], dp)
    local = [[seqs[i] for i in shard] for shard in shards]
    # every rank must run the same number of micro-batches (the all-reduce MAX, simulated)
    count = max(len(micro_batch_partition([len(s) for s in x], budget)) for x in local)
    return [make_micro_batches(x, budget, min_num_micro_batches=count) for x in local]


CASES = [
    ("token-mean", "vanilla"),
    ("seq-mean-token-sum", "vanilla"),
    ("seq-mean-token-mean", "vanilla"),
    ("seq-mean-token-sum-norm", "vanilla"),
    ("seq-mean-token-mean", "gspo"),
]


@pytest.mark.parametrize(("agg", "pg_mode"), CASES)
def test_loss_and_gradients_do_not_depend_on_batching(
    tiny_model: Callable[..., Qwen2ForCausalLM], agg: str, pg_mode: str
) -> None:
    model = tiny_model()
    seqs = _batch(model)
    ref_loss, ref_grad = _run(model, [[pack(seqs)]], agg, pg_mode)
    variants = {
        "micro-batches of <=16 tokens": [make_micro_batches(seqs, 16)],
        "one sequence per micro-batch": [make_micro_batches(seqs, 1)],
        "padded, 2 per batch": [[pad(seqs, [i, i + 1]) for i in range(0, len(seqs), 2)]],
        "dp=2": _dp_ranks(seqs, 2, 20),
        "dp=3": _dp_ranks(seqs, 3, 12),
    }
    assert len(variants["micro-batches of <=16 tokens"][0]) > 1
    for name, ranks in variants.items():
        loss, grad = _run(model, ranks, agg, pg_mode)
        assert loss == pytest.approx(ref_loss, abs=1e-5), name
        torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-4, msg=name)
    assert ref_grad.abs().max() > 1e-3  # the gradient is not trivially zero
