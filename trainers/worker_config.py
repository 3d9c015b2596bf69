"""WorkerConfig: a PolicyWorker's optimiser, sharding and loss settings (the ``actor`` section
of a run). Torch-free, as the whole config schema is (``trainers/choices.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from agentloop.errors import ConfigError
from agentloop.trainers.choices import (
    AGG_MODES,
    COMPUTE_DTYPES,
    KL_KINDS,
    PACKED_ATTN_IMPLEMENTATIONS,
    POLICY_LOSS_MODES,
)
from agentloop.trainers.lora_config import LoraConfig

__all__ = ["WorkerConfig"]


@dataclass(frozen=True)
class WorkerConfig:
    """Optimiser, sharding and loss settings of a :class:`PolicyWorker` (defaults live here only;
    the ``actor`` section of a run). The loss is
    ``policy + kl_coef·KL(ref) − entropy_coef·entropy``, each term aggregated with
    ``loss_agg_mode``."""

    lr: float = 1e-6
    """AdamW learning rate (peak, after warmup; >= 0)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay (>= 0)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW moment decay rates, two numbers in [0, 1)."""
    eps: float = 1e-8
    """AdamW denominator epsilon (> 0)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (>= 0); 0: no clipping."""
    warmup_steps: int = 0
    """Optimiser steps of linear learning-rate warmup from ``lr / warmup_steps`` to ``lr``
    (>= 0); 0: none."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in the backward pass: less memory, more compute."""
    cpu_offload: bool = False
    """Keep sharded params, grads and optimiser state in host memory (FSDP2
    ``CPUOffloadPolicy``); a no-op on a CPU device, where they are already."""
    dtype: str = "bfloat16"
    """Compute dtype on CUDA, ``bfloat16`` or ``float32`` (params in forward/backward; master
    weights and gradient reduction stay fp32). On CPU everything is fp32."""
    attn_implementation: str = "auto"
    """Attention kernel that keeps packed sequences apart: ``auto`` (``varlen``; on CUDA only
    where its bf16/fp16 kernel runs and for text models, else ``sdpa``), ``sdpa``, ``eager``,
    ``flex_attention``, ``flash_attention_2``, ``flash_attention_3`` or ``varlen`` (no ``T×T``
    mask: FlashAttention's varlen kernel on CUDA, SDPA per sequence on a CPU)."""
    device: str = "auto"
    """``cuda``, ``cpu``, or ``auto``: CUDA when available, else CPU."""
    seed: int = 0
    """Seed of the random init when the model is built from a config (not loaded from a dir)."""
    max_tokens_per_micro_batch: int = 8192
    """Token budget of one forward/backward (>= 1): sequences are packed into micro-batches of
    at most this many tokens; a longer sequence is a micro-batch of its own."""
    loss_agg_mode: str = "token-mean"
    """How per-token losses become one number: ``token-mean``, ``seq-mean-token-sum``,
    ``seq-mean-token-mean`` or ``seq-mean-token-sum-norm`` (Dr.GRPO, needs ``norm_len``)."""
    norm_len: int | None = None
    """The constant of ``seq-mean-token-sum-norm`` (the max response length, >= 1); None
    with the other modes."""
    policy_loss: str = "vanilla"
    """``vanilla``: PPO clip with dual-clip (verl); ``gspo``: the sequence-level ratio of GSPO."""
    clip_ratio_low: float = 0.2
    """PPO clip: the ratio is clipped below at ``1 - clip_ratio_low``, in [0, 1)."""
    clip_ratio_high: float = 0.2
    """PPO clip: the ratio is clipped above at ``1 + clip_ratio_high`` (>= 0; DAPO's
    clip-higher uses 0.28)."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound of ``vanilla`` (> 1): a negative-advantage token's loss is capped at
    ``-A · clip_ratio_c``."""
    tis_cap: float | None = None
    """Truncated importance sampling: weight each token's loss by ``min(π_old/π_engine,
    tis_cap)``, correcting trainer/engine mismatch and stale samples (> 0, e.g. 2.0; needed by
    ``trainer.mode`` one_step/async); None: off."""
    kl_coef: float = 0.0
    """Weight of the KL-to-reference loss term (>= 0); > 0 loads a frozen reference model."""
    kl_type: str = "low_var_kl"
    """KL estimator of the loss term: ``kl``/``k1``, ``abs``, ``mse``/``k2`` or
    ``low_var_kl``/``k3`` (verl's kinds)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss; a finite number, 0: off)."""
    temperature: float = 1.0
    """Temperature the logprobs are computed at (> 0): the rollout's, so they match the
    engine's; SFT needs 1."""
    freeze_vision: bool = False
    """A vision-language model's vision tower (patch embedding, blocks, merger) stays fixed: no
    gradients, no optimiser state; only the language model trains. Needs a VLM."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Low-rank adapters instead of full fine-tuning (off while ``lora.rank`` is 0): only the
    adapters train and hold optimiser state, and the weight sync sends the merged weights."""

    def __post_init__(self) -> None:
        def bad(field: str, fix: str) -> ConfigError:
            return ConfigError(f"WorkerConfig.{field}={getattr(self, field)!r}: {fix}")

        for name in ("lr", "weight_decay", "grad_clip", "kl_coef", "warmup_steps"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise bad(name, "must be a finite number >= 0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise bad("betas", "must be two numbers in [0, 1), e.g. (0.9, 0.999)")
        if not self.eps > 0:
            raise bad("eps", "must be > 0, e.g. 1e-8")
        checks: list[tuple[str, bool, str]] = [
            ("dtype", self.dtype in COMPUTE_DTYPES, f"must be one of {COMPUTE_DTYPES}"),
            (
                "attn_implementation",
                self.attn_implementation in ("auto", *PACKED_ATTN_IMPLEMENTATIONS),
                f"must separate packed sequences: 'auto' or one of {PACKED_ATTN_IMPLEMENTATIONS}",
            ),
            ("device", self.device in ("auto", "cpu", "cuda"), "must be 'auto', 'cpu' or 'cuda'"),
            (
                "max_tokens_per_micro_batch",
                self.max_tokens_per_micro_batch >= 1,
                "must be >= 1 (a token budget per forward, e.g. 8192)",
            ),
            ("loss_agg_mode", self.loss_agg_mode in AGG_MODES, f"must be one of {AGG_MODES}"),
            (
                "policy_loss",
                self.policy_loss in POLICY_LOSS_MODES,
                f"must be one of {POLICY_LOSS_MODES}",
            ),
            ("clip_ratio_low", 0.0 <= self.clip_ratio_low < 1.0, "must be in [0, 1), e.g. 0.2"),
            ("clip_ratio_high", self.clip_ratio_high >= 0.0, "must be >= 0 (DAPO uses 0.28)"),
            ("clip_ratio_c", self.clip_ratio_c > 1.0, "must be > 1 (dual-clip bound, e.g. 3.0)"),
            (
                "tis_cap",
                self.tis_cap is None or self.tis_cap > 0,
                "must be > 0 (e.g. 2.0), or None to turn TIS off",
            ),
            ("kl_type", self.kl_type in KL_KINDS, f"must be one of {KL_KINDS}"),
            ("entropy_coef", math.isfinite(self.entropy_coef), "must be a finite number"),
            ("temperature", self.temperature > 0, "must be > 0: the rollout's temperature"),
        ]
        for name, ok, fix in checks:
            if not ok:
                raise bad(name, fix)
        if self.loss_agg_mode == "seq-mean-token-sum-norm" and not (
            self.norm_len is not None and self.norm_len >= 1
        ):
            raise bad("norm_len", "seq-mean-token-sum-norm needs it: the max response length")
