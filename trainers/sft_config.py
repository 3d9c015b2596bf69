"""The SFT run's config (``agentloop sft``): its sections and their checks. Torch-free, as the
whole config schema is, so that loading, checking and printing one imports no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentloop.errors import ConfigError
from agentloop.trainers.config import (
    CheckpointConfig,
    LoggingConfig,
    ModelConfig,
    example_config,
    load_config,
)
from agentloop.trainers.worker_config import WorkerConfig

__all__ = [
    "LR_SCHEDULES",
    "SFTConfig",
    "SFTDataConfig",
    "SFTTrainerConfig",
    "load_sft_config",
]

LR_SCHEDULES = ("cosine", "linear", "constant")


def _need(ok: bool, section: str, name: str, value: Any, fix: str) -> None:
    if not ok:
        raise ConfigError(f"{section}.{name}={value!r}: {fix}")


@dataclass(frozen=True)
class SFTDataConfig:
    """The conversations to train on and the held-out set the eval loss is measured on."""

    train: str = "???"  # OmegaConf's MISSING: required
    """Required: a JSONL file of conversations, one ``{"messages": [...], "tools": [...]}`` row
    per line with OpenAI-style messages and tool calls (e.g. from ``agentloop
    make-calc-traces``)."""
    eval: str | None = None
    """A held-out JSONL file in the same format; None: hold out ``eval_fraction`` of ``train``."""
    eval_fraction: float = 0.05
    """Share of ``train`` held out (seeded by ``trainer.seed``) when ``eval`` is None, in
    [0, 1); 0: no held-out loss."""
    max_seq_len: int = 4096
    """Longest conversation in tokens (>= 2); a longer one is an error, or dropped with
    ``drop_overlong``."""
    drop_overlong: bool = False
    """Drop conversations longer than ``max_seq_len`` (the start-up summary counts them)
    instead of failing."""

    def __post_init__(self) -> None:
        _need(
            bool(self.train),
            "data",
            "train",
            self.train,
            "is required: a JSONL file of conversations (e.g. from `agentloop make-calc-traces`)",
        )
        _need(
            0.0 <= self.eval_fraction < 1.0,
            "data",
            "eval_fraction",
            self.eval_fraction,
            "must be in [0, 1) (0: no held-out loss)",
        )
        _need(self.max_seq_len >= 2, "data", "max_seq_len", self.max_seq_len, "must be >= 2")


@dataclass(frozen=True)
class SFTTrainerConfig:
    """The step loop: an epoch is ``len(train) // batch_size`` optimiser steps over a fresh
    seeded shuffle; the learning rate warms up over ``actor.warmup_steps``, then follows
    ``lr_schedule``."""

    epochs: int = 1
    """Passes over the training conversations (>= 1)."""
    max_steps: int | None = None
    """Stop after this many optimiser steps (>= 1) if that comes before the end of
    ``epochs``; None: run all epochs."""
    batch_size: int = 16
    """Conversations per optimiser step, over all ranks (>= 1, a multiple of the number of
    ranks); a remainder of an epoch shorter than a batch is left out."""
    lr_schedule: str = "cosine"
    """After warmup: ``cosine`` or ``linear`` from ``actor.lr`` down to ``min_lr_ratio ×
    actor.lr`` at the last step, or ``constant`` (``actor.lr`` throughout)."""
    min_lr_ratio: float = 0.0
    """The last step's learning rate as a share of ``actor.lr``, in [0, 1]."""
    eval_every: int = 0
    """Also measure the held-out loss every N steps (>= 0); it is always measured before the
    first step and after the last; 0: only then."""
    seed: int = 0
    """Seeds the held-out split and each epoch's shuffle (a resumed run sees the same batches)."""
    out_dir: str = "runs/sft"
    """Run directory: ``config.yaml``, ``metrics.jsonl``, ``tb/``, ``checkpoints/`` and the
    exported ``model/``."""

    def __post_init__(self) -> None:
        t = "trainer"
        _need(self.epochs >= 1, t, "epochs", self.epochs, "must be >= 1")
        _need(
            self.max_steps is None or self.max_steps >= 1,
            t,
            "max_steps",
            self.max_steps,
            "must be >= 1, or null for all epochs",
        )
        _need(self.batch_size >= 1, t, "batch_size", self.batch_size, "must be >= 1")
        _need(
            self.lr_schedule in LR_SCHEDULES,
            t,
            "lr_schedule",
            self.lr_schedule,
            f"must be one of {LR_SCHEDULES}",
        )
        _need(
            0.0 <= self.min_lr_ratio <= 1.0,
            t,
            "min_lr_ratio",
            self.min_lr_ratio,
            "must be in [0, 1]",
        )
        _need(self.eval_every >= 0, t, "eval_every", self.eval_every, "must be >= 0")


@dataclass(frozen=True)
class SFTConfig:
    """A whole SFT run, one section per concern. Load with ``load_config(SFTConfig, path, ...)``."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The model to fine-tune."""
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    """The training conversations and the held-out set."""
    actor: WorkerConfig = field(default_factory=lambda: WorkerConfig(lr=1e-5, warmup_steps=10))
    """The worker: optimiser, dtype, micro-batch token budget, activation checkpointing (SFT's
    defaults: ``lr`` 1e-5, ``warmup_steps`` 10; ``temperature`` stays 1)."""
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
    """Epochs, batch size, learning-rate schedule and held-out loss."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoints, resume and the final export."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Metric sinks."""

    def __post_init__(self) -> None:
        _need(
            self.actor.temperature == 1.0,
            "actor",
            "temperature",
            self.actor.temperature,
            "SFT scores tokens at temperature 1; remove the setting",
        )


def load_sft_config(config: str, overrides: list[str]) -> SFTConfig:
    """The config of ``agentloop sft CONFIG key=value ...``: a YAML file, or a shipped config's
    name, with the overrides applied."""
    path = Path(config)
    if not path.exists() and example_config(config).is_file():
        path = example_config(config)
    if not path.is_file():
        raise ConfigError(
            f"SFT config {config!r} is neither a file nor a shipped config; pass a YAML file "
            f"(an example: {example_config('sft_calc_tiny')})"
        )
    return load_config(SFTConfig, path, overrides)
