"""A model's tensors under their Hugging Face checkpoint names.

transformers renames (and for some architectures fuses) weights at load time, e.g. Qwen2.5-VL's
``model.language_model``; :func:`transformers.core_model_loading.revert_weight_conversion`
undoes that. Each call builds the reverse conversions again (for a model made from a config,
by walking every module: ~1 ms a call on a 2-core VM; ~44 us for a loaded 0.5B on a GPU host).
Called once per tensor on every weight sync, it was the sync's largest cost.
:class:`CheckpointNames` calls it once per name and remembers pure renames.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["CheckpointNames"]


class CheckpointNames:
    """``names(model_name, tensor)`` → ``{checkpoint name: tensor}`` for one of ``model``'s
    tensors. A name whose conversion is a pure renaming (the tensor itself comes back under
    one name) is looked up in a cache after its first call; any other conversion runs each time."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._renamed: dict[str, str] = {}

    def __call__(self, name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        from transformers.core_model_loading import revert_weight_conversion

        if (renamed := self._renamed.get(name)) is not None:
            return {renamed: tensor}
        out: dict[str, torch.Tensor] = revert_weight_conversion(self.model, {name: tensor})
        if len(out) == 1 and next(iter(out.values())) is tensor:
            self._renamed[name] = next(iter(out))
        return out
