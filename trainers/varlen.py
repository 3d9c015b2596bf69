"""Packed-sequence attention without a ``T×T`` mask and without the flash-attn package.

A packed micro-batch ``[1, T]`` holds several sequences, with ``cu_seqlens`` marking where each
starts. Under plain ``sdpa`` transformers keeps them apart with a block-diagonal ``[T, T]`` mask,
so attention costs ``T²``; here it costs the sum of the sequences' squared lengths:

- on CUDA in bf16/fp16, ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention on the packed
  ``[T, H, D]`` batch);
- elsewhere (a CPU, fp32), causal SDPA over each sequence's own slice, which on a CPU runs
  SDPA's flash kernel (at ``T`` = 4096 in 4 sequences, one layer's forward and backward: 1.50 s
  masked, 0.25 s per sequence, on one core of the 2-core dev VM).

:func:`register` makes it a transformers attention implementation named ``"varlen"`` (with
flash-style mask handling), so ``attn_implementation="varlen"`` works for any model that uses
transformers' attention interface. ``"auto"`` in :class:`~agentloop.trainers.worker.WorkerConfig`
picks it, except on CUDA where the kernel does not run (fp32) or for a vision-language model
(see :func:`resolve_attn_implementation`): ``sdpa`` there.
"""

from __future__ import annotations

import inspect
from itertools import pairwise
from typing import Any

import torch

__all__ = [
    "VARLEN",
    "VARLEN_DTYPES",
    "register",
    "resolve_attn_implementation",
    "varlen_available",
]

VARLEN = "varlen"


def varlen_available() -> bool:
    """Whether this torch has the varlen kernel and a CUDA device to run it on."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


#: The compute dtypes the varlen (FlashAttention) kernel takes.
VARLEN_DTYPES = (torch.bfloat16, torch.float16)


def resolve_attn_implementation(
    name: str, device: torch.device, dtype: torch.dtype, *, vision: bool = False
) -> str:
    """``auto`` → ``varlen``, except on CUDA where the kernel does not take ``dtype`` or is
    missing, and for a vision-language model (``vision``) on CUDA: ``sdpa`` there. Other names
    unchanged (``varlen`` is registered with transformers on the way).

    On CUDA a VLM gets ``sdpa``: with the varlen kernel a Qwen2.5-VL's trainer logprobs came out
    NaN in bf16 on an H200 (2026-11-27; sdpa gave the engine's to bf16 precision), and the
    vision tower's windowed attention is the likely cause. On a CPU ``varlen`` is per-sequence
    SDPA in fp32, which matches ``sdpa`` (tests/trainers/test_trainer_logprobs.py)."""
    if name == "auto":
        kernel = dtype in VARLEN_DTYPES and varlen_available() and not vision
        name = VARLEN if device.type != "cuda" or kernel else "sdpa"
    if name == VARLEN:
        register()
    return name


def register() -> None:
    """Register ``"varlen"`` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    AttentionInterface.register(VARLEN, _varlen_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(VARLEN, flash_attention_mask)


def _kernel_kwargs() -> dict[str, Any]:
    """Causal, GQA-aware keywords across torch versions (2.10 used ``is_causal``; later
    versions take ``window_size=(-1, 0)`` and ``enable_gqa``)."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    return {**causal, **({"enable_gqa": True} if "enable_gqa" in params else {})}


def _causal_padding_mask(padding: torch.Tensor, q_len: int) -> torch.Tensor:
    """``[B, T]`` keys-present mask → ``[B, 1, q_len, T]`` boolean causal mask for SDPA (the last
    ``q_len`` positions are queries). Every query also sees itself, so a padding query's row is
    never all-masked (SDPA would return NaN there; the loss ignores those positions anyway)."""
    t = padding.shape[-1]
    causal = torch.ones(q_len, t, dtype=torch.bool, device=padding.device).tril(t - q_len)
    diagonal = torch.eye(q_len, t, dtype=torch.bool, device=padding.device).roll(t - q_len, dims=1)
    return (causal[None, None] & padding.bool()[:, None, None, :]) | diagonal[None, None]


def _varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``query`` ``[1, Hq, T, D]``, ``key``/``value``
    ``[1, Hkv, T, D]``; returns ``[1, T, Hq, D]``. Without ``cu_seq_lens_q`` (a padded batch,
    generation, a vision tower's chunks) it is plain SDPA, with a flash-style 2-D padding mask
    made a 4-D causal one."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu_q = kwargs.get("cu_seq_lens_q")
    if cu_q is None or query.shape[0] != 1:
        if attention_mask is not None and attention_mask.dim() == 2:
            attention_mask = _causal_padding_mask(attention_mask, query.shape[2])
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if query.is_cuda and query.dtype in VARLEN_DTYPES and varlen_available():
        return _flash_varlen(query, key, value, scaling, **kwargs), None
    return _per_sequence_sdpa(module, query, key, value, cu_q, dropout, scaling), None


def _per_sequence_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    dropout: float,
    scaling: float | None,
) -> torch.Tensor:
    """Causal SDPA on each packed sequence's own slice (its keys are its queries): ``[1, T, Hq,
    D]``, where the kernel does not run (a CPU, fp32)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def one(a: int, b: int) -> torch.Tensor:
        q, k, v = query[:, :, a:b], key[:, :, a:b], value[:, :, a:b]
        out, _ = sdpa_attention_forward(
            module, q, k, v, None, dropout=dropout, scaling=scaling, is_causal=True
        )
        return out

    return torch.cat([one(a, b) for a, b in pairwise(cu_seqlens.tolist())], dim=1)


def _flash_varlen(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
    **kwargs: Any,
) -> torch.Tensor:
    """PyTorch's varlen FlashAttention kernel on the packed batch (CUDA, bf16/fp16)."""
    from torch.nn.attention.varlen import varlen_attn

    extra = _kernel_kwargs()
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))  # [T, H, D]
    if "enable_gqa" not in extra and k.shape[1] != q.shape[1]:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    cu_q = kwargs["cu_seq_lens_q"]
    cu_k = kwargs.get("cu_seq_lens_k", cu_q)
    out = varlen_attn(
        q,
        k,
        v,
        cu_q.to(torch.int32),
        cu_k.to(torch.int32),
        int(kwargs["max_length_q"]),
        int(kwargs.get("max_length_k", kwargs["max_length_q"])),
        scale=scaling,
        **extra,
    )
    assert isinstance(out, torch.Tensor)  # no return_aux requested: the output alone
    return out.unsqueeze(0)
