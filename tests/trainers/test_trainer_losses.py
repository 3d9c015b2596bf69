"""Policy losses, KL, entropy and aggregation against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from agentloop.errors import ConfigError
from agentloop.trainers.losses import (
    agg_loss,
    entropy_from_logits,
    kl_penalty,
    merge_metrics,
    policy_loss,
)

# two sequences, padded to 4: row 0 has loss tokens 1, 2, 3 (values 1, 2, 3); row 1 has 2 (value 4)
LOSS = torch.tensor([[9.0, 1.0, 2.0, 3.0], [9.0, 4.0, 9.0, 9.0]])
MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
# the same data packed: lengths 4 and 2
PACKED = torch.tensor([[9.0, 1.0, 2.0, 3.0, 9.0, 4.0]])
PMASK = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0, 1.0]])
CU = torch.tensor([0, 4, 6], dtype=torch.int32)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 10.0 / 4),
        ("seq-mean-token-sum", (6.0 + 4.0) / 2),
        ("seq-mean-token-mean", (2.0 + 4.0) / 2),
        ("seq-mean-token-sum-norm", (6.0 + 4.0) / (2 * 4)),
    ],
)
def test_agg_loss_modes_padded_and_packed(mode: str, expected: float) -> None:
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)
    packed = agg_loss(PACKED, PMASK, mode, cu_seqlens=CU, norm_len=4)
    assert packed.item() == pytest.approx(expected)


def test_agg_loss_global_counts_are_shares_of_the_global_loss() -> None:
    # the batch split in two micro-batches: the shares add up to the whole-batch value
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        whole = agg_loss(LOSS, MASK, mode)
        parts = sum(
            agg_loss(
                LOSS[i : i + 1], MASK[i : i + 1], mode, global_token_count=4, global_seq_count=2
            )
            for i in range(2)
        )
        assert float(parts) == pytest.approx(whole.item())


def test_agg_loss_ignores_fully_masked_sequences_and_nan_at_masked_positions() -> None:
    loss = torch.tensor([[float("nan"), 2.0], [5.0, 5.0]], requires_grad=True)
    mask = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    out = agg_loss(loss, mask, "seq-mean-token-mean")
    assert out.item() == 2.0  # one sequence with loss tokens, not two
    out.backward()
    assert loss.grad is not None
    assert loss.grad.tolist() == [[0.0, 1.0], [0.0, 0.0]]


def test_agg_loss_packed_sum_norm_requires_norm_len() -> None:
    with pytest.raises(ConfigError, match="norm_len"):
        agg_loss(PACKED, PMASK, "seq-mean-token-sum-norm", cu_seqlens=CU)


def test_agg_loss_bad_mode() -> None:
    with pytest.raises(ConfigError, match=r"'token-sum' is not one of .*token-mean"):
        agg_loss(LOSS, MASK, "token-sum")


def test_kl_penalty_kinds() -> None:
    lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    torch.testing.assert_close(kl_penalty(lp, ref, "k1"), torch.tensor([0.5, -1.0]))
    torch.testing.assert_close(kl_penalty(lp, ref, "kl"), torch.tensor([0.5, -1.0]))
    torch.testing.assert_close(kl_penalty(lp, ref, "abs"), torch.tensor([0.5, 1.0]))
    torch.testing.assert_close(kl_penalty(lp, ref, "mse"), torch.tensor([0.125, 0.5]))
    k3 = torch.tensor([math.exp(-0.5) + 0.5 - 1.0, math.exp(1.0) - 1.0 - 1.0])
    torch.testing.assert_close(kl_penalty(lp, ref, "k3"), k3)
    torch.testing.assert_close(kl_penalty(lp, ref, "low_var_kl"), k3)


def test_k3_is_clamped_like_verl() -> None:
    # log-ratio clamped to [-20, 20] (so -inf logprobs stay finite), the estimate to [-10, 10]
    lp = torch.tensor([-31.0, 0.0, float("-inf"), -1.0])
    ref = torch.tensor([-1.0, -100.0, 0.0, -4.0])
    assert kl_penalty(lp, ref, "k3").tolist() == [10.0, 10.0, 10.0, pytest.approx(math.exp(-3) + 2)]


def test_kl_bad_kind() -> None:
    with pytest.raises(ConfigError, match=r"'k4' is not one of"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


def test_entropy_from_logits() -> None:
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, -1e4, -1e4]])
    torch.testing.assert_close(
        entropy_from_logits(logits),
        torch.tensor([math.log(4.0), -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))]),
    )


# vanilla PPO, clip_ratio_low 0.2, clip_ratio_high 0.28, clip_ratio_c 3:
#   ratio 1.5, A=+1 -> clipped at 1.28        -> -1.28   (clipfrac)
#   ratio 0.5, A=+1 -> unclipped               -> -0.5
#   ratio 1.1, A=-1 -> unclipped               ->  1.1
#   ratio 5.0, A=-1 -> 5, dual-clip caps at 3  ->  3.0   (clipfrac_lower)
RATIOS = [1.5, 0.5, 1.1, 5.0]
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
OLD = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
NEW = OLD + torch.tensor([[math.log(r) for r in RATIOS]])


def test_vanilla_ppo_clip_higher_and_dual_clip() -> None:
    loss, m = policy_loss(
        NEW, OLD, ADV, torch.ones(1, 4), "vanilla", clip_ratio_low=0.2, clip_ratio_high=0.28
    )
    torch.testing.assert_close(loss, torch.tensor([[-1.28, -0.5, 1.1, 3.0]]))
    assert m.clipfrac.item() == pytest.approx(0.25)
    assert m.clipfrac_lower.item() == pytest.approx(0.25)
    assert m.approx_kl.item() == pytest.approx(-sum(math.log(r) for r in RATIOS) / 4, rel=1e-6)
    assert m.tis_mean.item() == 1.0 and m.num_tokens.item() == 4


def test_vanilla_metrics_respect_mask_and_gradients() -> None:
    new = NEW.clone().requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, m = policy_loss(new, OLD, ADV, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert m.clipfrac.item() == pytest.approx(1 / 3) and m.clipfrac_lower.item() == 0.0
    agg_loss(loss, mask, "token-mean").backward()
    assert new.grad is not None
    # d/dlp of -A·r = -A·r for unclipped tokens, 0 for the clipped one and the masked one
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, -0.5, 1.1, 0.0]]) / 3)


def test_tis_weights_are_capped_and_detached() -> None:
    old = torch.tensor([[-1.0, -1.0]])
    rollout = old - torch.tensor([[math.log(3.0), math.log(0.5)]])  # exp(old - rollout) = 3, 0.5
    new = old.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0]])
    loss, m = policy_loss(new, old, adv, torch.ones(1, 2), rollout_logprobs=rollout, tis_cap=2.0)
    torch.testing.assert_close(loss, torch.tensor([[-2.0, -0.5]]))
    assert m.tis_mean.item() == pytest.approx(1.25) and m.tis_max.item() == pytest.approx(2.0)
    assert m.tis_capped_frac.item() == 0.5
    assert m.rollout_abs_diff.item() == pytest.approx((math.log(3.0) + math.log(2.0)) / 2)
    loss.sum().backward()
    assert new.grad is not None
    torch.testing.assert_close(new.grad, torch.tensor([[-2.0, -0.5]]))


def test_gspo_sequence_ratio_padded_and_packed() -> None:
    # one sequence with log-ratios 0.1, 0.3 (mean 0.2) and a masked token; A = -1 (unclipped)
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    new = (old + torch.tensor([[0.1, 0.3, 5.0]])).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = torch.full((1, 3), -1.0)
    loss, m = policy_loss(new, old, adv, mask, "gspo", clip_ratio_low=0.1, clip_ratio_high=0.1)
    s = math.exp(0.2)
    torch.testing.assert_close(loss[:, :2], torch.tensor([[s, s]]))
    agg_loss(loss, mask, "seq-mean-token-mean").backward()
    assert new.grad is not None
    torch.testing.assert_close(new.grad, torch.tensor([[s / 2, s / 2, 0.0]]))
    assert m.clipfrac.item() == 0.0 and m.clipfrac_lower.item() == 0.0
    # A = +1: s = 1.2214 is clipped to 1.1 -> constant loss, no gradient
    loss_pos, m_pos = policy_loss(
        new, old, -adv, mask, "gspo", clip_ratio_low=0.1, clip_ratio_high=0.1
    )
    torch.testing.assert_close(loss_pos[:, :2], torch.tensor([[-1.1, -1.1]]))
    assert m_pos.clipfrac.item() == 1.0
    # packed next to a second sequence: same values for the first
    packed_new = torch.cat([new.detach(), torch.tensor([[-1.0, -0.4]])], dim=1)
    packed_old = torch.cat([old, torch.tensor([[-1.0, -1.0]])], dim=1)
    loss_p, _ = policy_loss(
        packed_new,
        packed_old,
        torch.full((1, 5), -1.0),
        torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]]),
        "gspo",
        cu_seqlens=torch.tensor([0, 3, 5], dtype=torch.int32),
    )
    torch.testing.assert_close(loss_p[0, [0, 1, 4]], torch.tensor([s, s, math.exp(0.6)]))


def test_policy_loss_config_errors() -> None:
    with pytest.raises(
        ConfigError, match=r"clip_ratio_c must be > 1\.0 for dual-clip PPO, got 0\.5"
    ):
        policy_loss(NEW, OLD, ADV, torch.ones(1, 4), clip_ratio_c=0.5)
    with pytest.raises(ConfigError, match=r"dual-clip PPO, got 1\.0"):
        policy_loss(NEW, OLD, ADV, torch.ones(1, 4), clip_ratio_c=1.0)
    with pytest.raises(ConfigError, match=r"'ppo' is not one of \('vanilla', 'gspo'\)"):
        policy_loss(NEW, OLD, ADV, torch.ones(1, 4), "ppo")
    with pytest.raises(ConfigError, match="tis_cap must be > 0"):
        policy_loss(NEW, OLD, ADV, torch.ones(1, 4), rollout_logprobs=OLD, tis_cap=0.0)


def test_merge_metrics_weights_by_tokens() -> None:
    _, a = policy_loss(NEW, OLD, ADV, torch.ones(1, 4), clip_ratio_low=0.2, clip_ratio_high=0.28)
    _, b = policy_loss(OLD[:, :2], OLD[:, :2], ADV[:, :2], torch.ones(1, 2))
    merged = merge_metrics([a, b])
    assert merged["num_tokens"] == 6.0
    assert merged["clipfrac"] == pytest.approx(0.25 * 4 / 6)
