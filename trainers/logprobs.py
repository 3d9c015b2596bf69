"""Per-token logprobs (and entropy) of an HF causal LM on packed or padded batches."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from agentloop.errors import ConfigError
from agentloop.trainers.choices import PACKED_ATTN_IMPLEMENTATIONS
from agentloop.trainers.packing import MicroBatch, PaddedBatch

__all__ = [
    "PACKED_ATTN_IMPLEMENTATIONS",
    "TokenLogprobs",
    "logprobs_from_logits",
    "token_logprobs",
]


@dataclass(frozen=True)
class TokenLogprobs:
    """``logprobs[b, t] = log p(token t | tokens < t)`` (fp32); 0 at each sequence's first token
    and at padding. ``entropy[b, t]``: entropy of that same predictive distribution."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None


def _chunk_forward(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    banned: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One ``[c, V]`` block: (logprob of ``labels``, log-sum-exp, entropy or None), fp32."""
    z = logits.float() / temperature
    lse = torch.logsumexp(_ban(z, banned), dim=-1)
    lp = z.gather(1, labels[:, None])[:, 0] - lse
    if not with_entropy:
        return lp, lse, None
    p = _unban(torch.exp(z - lse[:, None]), banned)
    return lp, lse, lse - (p * z).sum(-1)


def _chunk_backward(
    logits: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    ent: torch.Tensor | None,
    g_lp: torch.Tensor | None,
    g_ent: torch.Tensor | None,
    temperature: float,
    banned: torch.Tensor | None,
) -> torch.Tensor:
    """The gradient of one ``[c, V]`` block, in the logits' dtype (the softmax recomputed)."""
    logp = logits.float() / temperature - lse[:, None]
    p = _unban(torch.exp(logp), banned)
    g = torch.zeros_like(p)
    if g_lp is not None:
        g = g - p * g_lp[:, None]
        g = g.scatter_add(1, labels[:, None], g_lp[:, None].float())
    if ent is not None and g_ent is not None:
        g = g - g_ent[:, None] * p * (logp + ent[:, None])  # dH/dz_j = -p_j (log p_j + H)
    return (g / temperature).to(logits.dtype)


@functools.cache
def _compiled() -> tuple[Callable[..., Any], Callable[..., Any]]:
    # On a GPU the block math is a dozen passes over [c, V] fp32 memory when run op by op
    # (the largest share of a small model's training step: bench/gpu/profile_train.py);
    # compiled, it is one reduction and one pointwise kernel reading the logits once or twice.
    return torch.compile(_chunk_forward, dynamic=True), torch.compile(_chunk_backward, dynamic=True)


def _block_fns(device: torch.device) -> tuple[Callable[..., Any], Callable[..., Any]]:
    return _compiled() if device.type == "cuda" else (_chunk_forward, _chunk_backward)


class _ChunkedLogprob(torch.autograd.Function):
    """Gathered log-softmax (and entropy) over ``[N, V]`` logits, chunked along ``N``.

    Only one ``[chunk, V]`` fp32 block exists at a time, in forward and in backward (which
    recomputes the softmax); what is saved is the logits themselves, in their own dtype.
    ``banned`` ids (``[K]``; a VLM's vision markup, never sampled) are left out of the softmax:
    the distribution is the sampler's. A banned label still gets a finite logprob. On CUDA each
    block's math runs compiled (``torch.compile``), elsewhere op by op.
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        labels: torch.Tensor,
        temperature: float,
        with_entropy: bool,
        chunk_size: int,
        banned: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = logits.shape[0]
        block, _ = _block_fns(logits.device)
        lp = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(lp)
        ent = torch.empty_like(lp) if with_entropy else lp.new_zeros(0)
        for s in range(0, n, chunk_size):
            rows = slice(s, s + chunk_size)
            lp[rows], lse[rows], e = block(
                logits[rows], labels[rows], temperature, with_entropy, banned
            )
            if e is not None:
                ent[rows] = e
        ctx.save_for_backward(logits, labels, lse, ent)
        ctx.banned = banned
        ctx.temperature, ctx.with_entropy, ctx.chunk_size = temperature, with_entropy, chunk_size
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(
        ctx: Any, g_lp: torch.Tensor | None, g_ent: torch.Tensor | None
    ) -> tuple[torch.Tensor, None, None, None, None, None]:
        logits, labels, lse, ent = ctx.saved_tensors
        _, block = _block_fns(logits.device)
        grad = torch.empty_like(logits)
        for s in range(0, logits.shape[0], ctx.chunk_size):
            rows = slice(s, s + ctx.chunk_size)
            grad[rows] = block(
                logits[rows],
                labels[rows],
                lse[rows],
                ent[rows] if ctx.with_entropy else None,
                None if g_lp is None else g_lp[rows],
                None if g_ent is None else g_ent[rows],
                ctx.temperature,
                ctx.banned,
            )
        return grad, None, None, None, None, None


def _ban(z: torch.Tensor, banned: torch.Tensor | None) -> torch.Tensor:
    """``z`` with the banned columns at -inf (a copy; ``z`` itself when nothing is banned)."""
    if banned is None:
        return z
    return z.index_fill(1, banned, float("-inf"))


def _unban(p: torch.Tensor, banned: torch.Tensor | None) -> torch.Tensor:
    """Probabilities with the banned columns zeroed."""
    return p if banned is None else p.index_fill(1, banned, 0.0)


def logprobs_from_logits(
    logits_NV: torch.Tensor,
    labels_N: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int = 1024,
    banned_token_ids: tuple[int, ...] = (),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(logits / temperature)[label]`` per row ``[N]`` (fp32), and the entropy;
    ``banned_token_ids`` are left out of the softmax (the sampler never drew them)."""
    if temperature <= 0:
        raise ConfigError(f"temperature must be > 0 to score tokens, got {temperature}")
    banned = (
        torch.tensor(banned_token_ids, dtype=torch.long, device=logits_NV.device)
        if banned_token_ids
        else None
    )
    # torch's Function.apply is unannotated: its result is typed here, where it enters agentloop
    chunked: Callable[..., tuple[torch.Tensor, torch.Tensor]] = _ChunkedLogprob.apply
    lp, ent = chunked(logits_NV, labels_N, temperature, with_entropy, chunk_size, banned)
    return lp, (ent if with_entropy else None)


def _forward_logits(model: torch.nn.Module, batch: MicroBatch | PaddedBatch) -> torch.Tensor:
    if isinstance(batch, PaddedBatch):
        padded: torch.Tensor = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        ).logits
        return padded
    impl = str(getattr(model.config, "_attn_implementation", None))
    kwargs: dict[str, Any] = {}
    if "flash" in impl or impl == "varlen":
        cu = batch.cu_seqlens.to(device=batch.input_ids.device, dtype=torch.int32)
        kwargs = dict(
            cu_seq_lens_q=cu,
            cu_seq_lens_k=cu,
            max_length_q=batch.max_seqlen,
            max_length_k=batch.max_seqlen,
        )
    elif impl not in PACKED_ATTN_IMPLEMENTATIONS:
        raise ConfigError(
            f"attention implementation {impl!r} is not known to separate packed sequences; use "
            f"one of {PACKED_ATTN_IMPLEMENTATIONS}"
        )
    position_ids = batch.position_ids
    if batch.mrope_position_ids is not None:
        # [4, 1, T]: Qwen2-VL takes the restarting text positions first (they mark the packed
        # sequences' boundaries), then each sequence's own M-RoPE rows
        position_ids = torch.cat([position_ids[None], batch.mrope_position_ids.to(position_ids)])
    if batch.images is not None:
        kwargs.update(
            pixel_values=batch.images.pixel_values, image_grid_thw=batch.images.image_grid_thw
        )
    # use_cache=False matters: with a cache object (config.use_cache defaults to True) transformers
    # skips packed-sequence detection and every token attends across sequence boundaries.
    logits: torch.Tensor = model(
        input_ids=batch.input_ids, position_ids=position_ids, use_cache=False, **kwargs
    ).logits
    return logits


def token_logprobs(
    model: torch.nn.Module,
    batch: MicroBatch | PaddedBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int = 1024,
    banned_token_ids: tuple[int, ...] = (),
) -> TokenLogprobs:
    """Run ``model`` on a packed ``[1, T]`` (or padded ``[B, L]``) batch; logprobs aligned with
    the batch: position ``t`` scores token ``t`` with the logits at ``t - 1``.

    Packed: no attention mask is passed, position ids restart per sequence and
    ``use_cache=False``, so attention never crosses a sequence boundary (flash kernels also get
    ``cu_seqlens``). Divide by ``temperature`` and leave out ``banned_token_ids`` as the sampler
    did, so logprobs match the engine's. A vision-language batch also passes its images and
    M-RoPE positions.
    """
    logits = _forward_logits(model, batch)  # [B, T, V]
    ids = batch.input_ids
    labels = torch.roll(ids, shifts=-1, dims=1)  # labels[t] = ids[t + 1]
    lp, ent = logprobs_from_logits(
        logits.reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        temperature=temperature,
        with_entropy=with_entropy,
        chunk_size=chunk_size,
        banned_token_ids=banned_token_ids,
    )
    if isinstance(batch, PaddedBatch):
        valid = batch.attention_mask.to(torch.bool).clone()
        valid[:, 0] = False
    else:
        valid = torch.ones_like(ids, dtype=torch.bool)
        valid[0, batch.cu_seqlens[:-1].long().to(ids.device)] = False

    def align(x: torch.Tensor) -> torch.Tensor:
        # x[t] belongs to token t+1: shift right; sequence starts and padding get 0
        return torch.where(valid, torch.roll(x.view(ids.shape), shifts=1, dims=1), 0.0)

    return TokenLogprobs(logprobs=align(lp), entropy=None if ent is None else align(ent))
