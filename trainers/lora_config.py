"""LoraConfig: the ``actor.lora`` section, low-rank adapters on the policy (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

from agentloop.errors import ConfigError

__all__ = ["DEFAULT_TARGET_MODULES", "LoraConfig"]

DEFAULT_TARGET_MODULES: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
"""Every linear layer of a Qwen2/Llama-style decoder block (attention and MLP)."""


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters (LoRA) on the policy's linear layers; off while ``rank`` is 0.

    On, the base weights are frozen (no gradients, no optimiser state) and each targeted linear
    ``W`` trains ``W + (alpha / rank) · B·A`` with ``A`` ``[rank, in]`` and ``B`` ``[out, rank]``
    (``B`` starts at zero, so step 0 is the base model). A vision-language model's vision tower
    never gets adapters."""

    rank: int = 0
    """Adapter rank r (>= 0); 0: LoRA off, the whole model trains."""
    alpha: int = 32
    """Scale numerator, an integer (PEFT's ``lora_alpha``): the adapter's update is multiplied
    by ``alpha / rank`` (> 0)."""
    dropout: float = 0.0
    """Dropout on the adapter's input in training, in [0, 1)."""
    target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES
    """Names (the last part of a module's dotted name, e.g. ``q_proj``) of the linear layers
    that get adapters; each must name at least one linear layer of the language model."""

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank if self.rank else 0.0

    def __post_init__(self) -> None:
        def bad(field: str, fix: str) -> ConfigError:
            return ConfigError(f"LoraConfig.{field}={getattr(self, field)!r}: {fix}")

        if not (isinstance(self.rank, int) and self.rank >= 0):
            raise bad("rank", "must be an integer >= 0 (e.g. 16); 0 turns LoRA off")
        if not (isinstance(self.alpha, int) and self.alpha > 0):
            raise bad("alpha", "must be an integer > 0 (e.g. 32, or 2 x rank)")
        if not 0.0 <= self.dropout < 1.0:
            raise bad("dropout", "must be in [0, 1), e.g. 0.0 or 0.05")
        names = tuple(self.target_modules)
        if not names or not all(isinstance(n, str) and n and "." not in n for n in names):
            raise bad(
                "target_modules",
                "must be a non-empty list of module names without dots, e.g. [q_proj, v_proj]",
            )
        if len(set(names)) != len(names):
            raise bad("target_modules", "names a module twice; list each once")
