"""Policy losses, KL penalties, entropy and loss aggregation, as pure tensor functions (verl)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from agentloop.errors import ConfigError
from agentloop.trainers.choices import AGG_MODES, KL_KINDS, POLICY_LOSS_MODES

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "POLICY_LOSS_MODES",
    "PolicyLossMetrics",
    "agg_loss",
    "entropy_from_logits",
    "kl_penalty",
    "masked_mean",
    "merge_metrics",
    "policy_loss",
    "segment_ids",
]


def _check_choice(what: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"{what} {value!r} is not one of {tuple(choices)}; pick one of those")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is non-zero (0 when the mask is empty)."""
    m = mask.to(x.dtype)
    return torch.where(m > 0, x, 0.0).sum() / m.sum().clamp(min=1.0)


def segment_ids(
    shape: torch.Size, cu_seqlens: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """Sequence index of every element of a ``[B, T]`` tensor.

    Padded layout (``cu_seqlens`` None): row ``b`` is sequence ``b``. Packed layout (``[1, T]``
    with ``cu_seqlens [S+1]``): position ``t`` belongs to the ``s`` with
    ``cu_seqlens[s] <= t < cu_seqlens[s+1]``.
    """
    if cu_seqlens is None:
        return torch.arange(shape[0], device=device)[:, None].expand(shape)
    if shape[0] != 1 or int(cu_seqlens[-1]) != shape[1]:
        raise ValueError(
            f"packed tensors must be [1, T] with cu_seqlens[-1] == T; got shape {tuple(shape)} "
            f"and cu_seqlens[-1] = {int(cu_seqlens[-1])}"
        )
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(device)
    seg = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
    return seg[None]


def _seq_sums(x: torch.Tensor, seg: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """Per-sequence sums ``[S]`` of ``x [B, T]`` (differentiable)."""
    out = torch.zeros(num_seqs, dtype=x.dtype, device=x.device)
    return out.index_add(0, seg.reshape(-1), x.reshape(-1))


def _num_seqs(shape: torch.Size, cu_seqlens: torch.Tensor | None) -> int:
    return shape[0] if cu_seqlens is None else len(cu_seqlens) - 1


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    cu_seqlens: torch.Tensor | None = None,
    global_token_count: float | torch.Tensor | None = None,
    global_seq_count: float | torch.Tensor | None = None,
    norm_len: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss ``[B, T]`` (padded rows, or packed ``[1, T]`` + ``cu_seqlens``).

    The value returned is this micro-batch's *share* of the loss of the whole global batch: summing
    it over every micro-batch and every DP rank gives the global loss, so gradients do not depend
    on micro-batch or DP size. Pass the global counts (summed over micro-batches and all-reduced
    over ranks); left ``None`` they default to this micro-batch's own counts (verl's behaviour for
    a single micro-batch). Only sequences with at least one loss token count as sequences.

    - ``token-mean``: ``Σ_it l·m / N_tokens``
    - ``seq-mean-token-sum``: ``Σ_i (Σ_t l·m) / N_seqs``
    - ``seq-mean-token-mean``: ``Σ_i (Σ_t l·m / n_i) / N_seqs``
    - ``seq-mean-token-sum-norm`` (Dr.GRPO): ``Σ_i (Σ_t l·m) / (N_seqs · norm_len)`` with
      ``norm_len`` a constant (the max response length); it defaults to ``T`` for padded input and
      is required for packed input. verl divides the micro-batch token sum by ``norm_len`` without
      the ``1/N_seqs``; ours is the same objective up to that constant, and invariant.

    Masked positions use ``torch.where``, so their gradient is exactly zero even if ``l`` is not
    finite there.
    """
    _check_choice("loss_agg_mode", mode, AGG_MODES)
    m = mask.to(loss_mat.dtype)
    masked = torch.where(m > 0, loss_mat, 0.0)
    if mode == "token-mean":
        count = m.sum() if global_token_count is None else global_token_count
        return masked.sum() / _clamp1(count)
    seg = segment_ids(loss_mat.shape, cu_seqlens, loss_mat.device)
    num = _num_seqs(loss_mat.shape, cu_seqlens)
    tokens_S = _seq_sums(m, seg, num)
    sums_S = _seq_sums(masked, seg, num)
    seqs = (tokens_S > 0).to(loss_mat.dtype).sum() if global_seq_count is None else global_seq_count
    if mode == "seq-mean-token-sum":
        return sums_S.sum() / _clamp1(seqs)
    if mode == "seq-mean-token-mean":
        return (sums_S / tokens_S.clamp(min=1.0)).sum() / _clamp1(seqs)
    if norm_len is None:
        if cu_seqlens is not None:
            raise ConfigError(
                "loss_agg_mode 'seq-mean-token-sum-norm' on packed input needs norm_len (a "
                "constant such as the max response length); pass norm_len=max_response_len"
            )
        norm_len = loss_mat.shape[-1]
    return sums_S.sum() / (_clamp1(seqs) * norm_len)


def _clamp1(count: float | torch.Tensor) -> float | torch.Tensor:
    return count.clamp(min=1) if isinstance(count, torch.Tensor) else max(float(count), 1.0)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` between the policy and the reference (verl's kinds).

    ``k1``/``kl``: ``lp - ref``; ``abs``: ``|lp - ref|``; ``k2``/``mse``: ``½(lp - ref)²``;
    ``k3``/``low_var_kl``: ``exp(ref - lp) - (ref - lp) - 1`` with the log-ratio clamped to
    ``[-20, 20]`` and the result to ``[-10, 10]``. Aggregate with :func:`agg_loss` for a loss
    term, or subtract ``coef ·`` it from token rewards for a reward penalty.
    """
    _check_choice("kl kind", kind, KL_KINDS)
    if kind in ("kl", "k1"):
        return logprob - ref_logprob
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    log_ratio = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-10.0, max=10.0)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Categorical entropy ``[...]`` of ``logits [..., V]`` (computed in fp32)."""
    z = logits.float()
    lse = torch.logsumexp(z, dim=-1)
    return lse - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


@dataclass(frozen=True)
class PolicyLossMetrics:
    """Detached 0-d tensors from one micro-batch; means are over its loss tokens.

    ``clipfrac``: share of tokens where the clipped term was used; ``clipfrac_lower``: share where
    dual-clip bound ``clip_ratio_c`` was used; ``approx_kl``: mean ``old - new`` logprob;
    ``tis_*``: truncated-importance-sampling weights ``min(exp(old - rollout), cap)`` (1 when TIS
    is off); ``rollout_abs_diff``: mean ``|old - rollout|``, the engine/trainer mismatch.
    """

    num_tokens: torch.Tensor
    clipfrac: torch.Tensor
    clipfrac_lower: torch.Tensor
    approx_kl: torch.Tensor
    tis_mean: torch.Tensor
    tis_max: torch.Tensor
    tis_capped_frac: torch.Tensor
    rollout_abs_diff: torch.Tensor


def merge_metrics(metrics: Sequence[PolicyLossMetrics]) -> dict[str, float]:
    """Token-weighted means over micro-batches (``tis_max``: the max), as plain floats."""
    total = sum(float(m.num_tokens) for m in metrics)
    out: dict[str, float] = {"num_tokens": total}
    for f in fields(PolicyLossMetrics):
        if f.name == "num_tokens":
            continue
        values = [float(getattr(m, f.name)) for m in metrics]
        if f.name == "tis_max":
            out[f.name] = max(values, default=0.0)
        else:
            weights = [float(m.num_tokens) for m in metrics]
            out[f.name] = sum(v * w for v, w in zip(values, weights, strict=True)) / max(total, 1.0)
    return out


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "vanilla",
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    rollout_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, PolicyLossMetrics]:
    """Per-token policy-gradient loss ``[B, T]`` and metrics; reduce it with :func:`agg_loss`.

    ``vanilla`` (verl): PPO clip ``max(-A·r, -A·clip(r, 1-low, 1+high))`` with
    ``r = exp(clamp(lp - old, ±20))``; for ``A < 0`` additionally capped at ``-A·clip_ratio_c``
    (dual-clip). ``gspo`` (verl): the sequence ratio ``s_i = exp(mean_t(lp - old))`` (over the
    sequence's loss tokens), per token ``sg[s_i]·exp(lp - sg[lp])`` (log clamped at 10), then the
    same two-sided clip without dual-clip; verl aggregates it with ``seq-mean-token-mean``.

    TIS: with ``tis_cap`` and ``rollout_logprobs`` (the engine's), the loss is multiplied by the
    detached weight ``min(exp(old - rollout), tis_cap)``, correcting engine/trainer mismatch.
    """
    _check_choice("policy_loss mode", mode, POLICY_LOSS_MODES)
    if mode == "vanilla" and not clip_ratio_c > 1.0:
        raise ConfigError(f"clip_ratio_c must be > 1.0 for dual-clip PPO, got {clip_ratio_c}")
    if tis_cap is not None and not tis_cap > 0:
        raise ConfigError(f"tis_cap must be > 0 (or None to disable TIS), got {tis_cap}")
    m = mask.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs
    if mode == "vanilla":
        ratio = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    else:
        seg = segment_ids(logprobs.shape, cu_seqlens, logprobs.device)
        num = _num_seqs(logprobs.shape, cu_seqlens)
        masked_lr = torch.where(m > 0, log_ratio, 0.0)
        seq_lr = _seq_sums(masked_lr, seg, num) / _seq_sums(m, seg, num).clamp(min=1.0)
        log_s = logprobs - logprobs.detach() + seq_lr.detach()[seg]
        ratio = torch.exp(torch.clamp(log_s, max=10.0))
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped = torch.maximum(loss1, loss2)
    clipfrac = masked_mean((loss2 > loss1).to(m.dtype), m)
    if mode == "vanilla":
        loss3 = -advantages * clip_ratio_c
        lower = torch.minimum(loss3, clipped)
        clipfrac_lower = masked_mean(((clipped > loss3) & (advantages < 0)).to(m.dtype), m)
        loss = torch.where(advantages < 0, lower, clipped)
    else:
        clipfrac_lower = torch.zeros((), dtype=m.dtype, device=m.device)
        loss = clipped
    loss, tis = _apply_tis(loss, old_logprobs, rollout_logprobs, tis_cap)
    metrics = _metrics(
        m, clipfrac, clipfrac_lower, log_ratio, tis, tis_cap, old_logprobs, rollout_logprobs
    )
    return loss, metrics


def _apply_tis(
    loss: torch.Tensor,
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor | None,
    tis_cap: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if tis_cap is None or rollout_logprobs is None:
        return loss, torch.ones_like(loss)
    weight = torch.clamp(torch.exp(old_logprobs - rollout_logprobs), max=tis_cap).detach()
    return loss * weight, weight


def _metrics(
    m: torch.Tensor,
    clipfrac: torch.Tensor,
    clipfrac_lower: torch.Tensor,
    log_ratio: torch.Tensor,
    tis: torch.Tensor,
    tis_cap: float | None,
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor | None,
) -> PolicyLossMetrics:
    with torch.no_grad():
        keep = m > 0
        tis_max = torch.where(keep, tis, 0.0).amax()  # weights are > 0: a masked 0 never wins
        capped = (tis >= tis_cap).to(m.dtype) if tis_cap is not None else torch.zeros_like(m)
        diff = (
            (old_logprobs - rollout_logprobs).abs()
            if rollout_logprobs is not None
            else torch.zeros_like(m)
        )
        return PolicyLossMetrics(
            num_tokens=m.sum().detach(),
            clipfrac=clipfrac.detach(),
            clipfrac_lower=clipfrac_lower.detach(),
            approx_kl=masked_mean(-log_ratio.detach(), m),
            tis_mean=masked_mean(tis, m),
            tis_max=tis_max.detach(),
            tis_capped_frac=masked_mean(capped, m),
            rollout_abs_diff=masked_mean(diff, m),
        )
