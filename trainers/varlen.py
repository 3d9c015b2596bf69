"""Packed-sequence attention on CUDA without the flash-attn package: PyTorch's varlen kernel.

``torch.nn.attention.varlen.varlen_attn`` runs FlashAttention on a packed ``[T, H, D]`` batch with
``cu_seqlens`` — no ``T×T`` mask, no padding, cost linear in the sum of squared sequence lengths.
:func:`register` makes it a transformers attention implementation named ``"varlen"`` (with
flash-style mask handling), so ``attn_implementation="varlen"`` works for any model that uses
transformers' attention interface. ``"auto"`` in :class:`~agentloop.trainers.worker.WorkerConfig`
picks it on CUDA and ``sdpa`` elsewhere.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from agentloop.errors import ConfigError

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
    """``auto`` → ``varlen`` on CUDA when available and ``dtype`` is one it takes, else
    ``sdpa``; other names unchanged (``varlen`` is registered with transformers on the way).

    A vision-language model (``vision``) gets ``sdpa``: with ``varlen`` a Qwen2.5-VL's trainer
    logprobs came out NaN in bf16 on an H200 (2026-11-27; sdpa gave the engine's to bf16
    precision), and the vision tower's windowed attention is the likely cause."""
    if name == "auto":
        fits = device.type == "cuda" and dtype in VARLEN_DTYPES and varlen_available()
        fits = fits and not vision
        name = VARLEN if fits else "sdpa"
    if name == VARLEN:
        if dtype not in VARLEN_DTYPES:
            raise ConfigError(
                f"attn_implementation='varlen' runs FlashAttention, which takes bfloat16 or "
                f"float16, not {dtype}; use dtype=bfloat16 or attn_implementation=sdpa"
            )
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
    generation) it is plain SDPA, with flash-style 2-D padding mask made a 4-D causal one."""
    cu_q = kwargs.get("cu_seq_lens_q")
    if cu_q is None or query.shape[0] != 1:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        if attention_mask is not None and attention_mask.dim() == 2:
            attention_mask = _causal_padding_mask(attention_mask, query.shape[2])
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    from torch.nn.attention.varlen import varlen_attn

    extra = _kernel_kwargs()
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))  # [T, H, D]
    if "enable_gqa" not in extra and k.shape[1] != q.shape[1]:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
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
    return out.unsqueeze(0), None
