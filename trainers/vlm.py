"""Vision-language policies in the trainer: the images of a sequence, M-RoPE positions, loading.

A Qwen2-VL-family trajectory's token ids already hold one placeholder run per image (expanded by
the vision :class:`~agentloop.chat.TokenBuilder`). To score it, the model also needs the images'
``pixel_values`` and ``image_grid_thw`` (:class:`ImageInputs`, made by the model's own image
processor) and its multimodal rotary positions ``[3, L]`` (temporal, height, width), which the
model's ``get_rope_index`` computes from the ids and the grids (:class:`VisionSpec`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from agentloop.errors import TrajectoryError
from agentloop.vision import check_image_placeholders

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    from agentloop.types import Trajectory
    from agentloop.vision import VisionProcessor

__all__ = [
    "ImageInputs",
    "RopeIndex",
    "VisionSpec",
    "cat_images",
    "image_inputs",
    "is_vlm_config",
    "model_class",
    "vision_spec",
    "vision_tower",
]

#: ``(token_ids [L], image_grid_thw [I, 3] or None) -> M-RoPE position ids [3, L]``.
RopeIndex = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


@dataclass(frozen=True)
class ImageInputs:
    """The images of one sequence (or of a packed micro-batch, in sequence order) as the vision
    tower takes them: ``pixel_values [P, D]`` (every image's flattened patches, image after image)
    and ``image_grid_thw [I, 3]`` (each image's patch grid; ``P = Σ t·h·w``)."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor

    def __post_init__(self) -> None:
        grid = self.image_grid_thw
        if grid.ndim != 2 or grid.shape[1] != 3 or grid.shape[0] == 0:
            raise ValueError(f"image_grid_thw has shape {tuple(grid.shape)}, expected (I >= 1, 3)")
        patches = int(grid.prod(-1).sum())
        if self.pixel_values.ndim != 2 or self.pixel_values.shape[0] != patches:
            raise ValueError(
                f"pixel_values has shape {tuple(self.pixel_values.shape)}; the grids "
                f"{grid.tolist()} need ({patches}, D)"
            )

    @property
    def num_images(self) -> int:
        return int(self.image_grid_thw.shape[0])

    def to(self, device: torch.device | str) -> ImageInputs:
        return ImageInputs(self.pixel_values.to(device), self.image_grid_thw.to(device))


def image_inputs(trajectory: Trajectory, vision: VisionProcessor) -> ImageInputs | None:
    """The :class:`ImageInputs` of a trajectory's images (None without images), made by the
    processor that counted its placeholders: the grids must be the trajectory's own and the
    placeholder runs must fit them, else :class:`TrajectoryError` (a different pixel budget)."""
    if not trajectory.images:
        return None
    inputs = vision.pixel_inputs(trajectory.images)
    grids = [tuple(int(v) for v in g) for g in inputs["image_grid_thw"].tolist()]
    if trajectory.image_grids and list(trajectory.image_grids) != grids:
        raise TrajectoryError(
            f"trajectory {trajectory.task_id!r}: its image grids {list(trajectory.image_grids)} "
            f"differ from the trainer's processor's {grids}; train with the rollout's pixel "
            "budget (min_pixels/max_pixels)"
        )
    check_image_placeholders(
        trajectory.token_ids,
        grids,
        image_token_id=vision.tokens.image,
        merge_size=vision.merge_size,
    )
    return ImageInputs(inputs["pixel_values"].float(), inputs["image_grid_thw"].long())


def cat_images(parts: Sequence[ImageInputs | None]) -> ImageInputs | None:
    """The images of several sequences, concatenated in order (None if none has images)."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    return ImageInputs(
        torch.cat([p.pixel_values for p in present]),
        torch.cat([p.image_grid_thw for p in present]),
    )


@dataclass(frozen=True)
class VisionSpec:
    """What the policy worker needs of a vision-language model: the image placeholder id, the
    ids a sampler bans (vision markup: the trainer scores tokens under the same ban, so its
    logprobs are the engine's) and the model's M-RoPE index."""

    image_token_id: int
    banned_token_ids: tuple[int, ...]
    rope_index: RopeIndex = dataclasses.field(compare=False)


def _vlm_classes() -> tuple[type, ...]:
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration

    return (Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration)


def is_vlm_config(config: PretrainedConfig) -> bool:
    """Whether ``config`` is a Qwen2-VL / Qwen2.5-VL model's (the VLMs the trainer takes)."""
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig

    return isinstance(config, Qwen2VLConfig | Qwen2_5_VLConfig)


def model_class(config: PretrainedConfig) -> type[_BaseAutoModelClass]:
    """The transformers auto class that builds ``config``'s model with its LM head."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vlm_config(config) else AutoModelForCausalLM


def vision_tower(model: PreTrainedModel) -> torch.nn.Module | None:
    """The vision encoder (patch embedding, blocks, merger) of a VLM; None for a text model."""
    if not isinstance(model, _vlm_classes()):
        return None
    tower = model.model.visual
    assert isinstance(tower, torch.nn.Module)
    return tower


def _banned(model: PreTrainedModel, source_dir: Path | None) -> tuple[int, ...]:
    """The rollout's banned ids: the tokenizer's vision markup (what the vision TokenBuilder
    bans) when the model came from a directory, else the ids its config names."""
    if source_dir is not None and (source_dir / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        from agentloop.vision import VISION_TOKENS

        vocab = AutoTokenizer.from_pretrained(source_dir).get_vocab()
        return tuple(vocab[t] for t in VISION_TOKENS if t in vocab)
    c = model.config
    ids = (c.vision_start_token_id, c.vision_end_token_id, c.image_token_id, c.video_token_id)
    return tuple(int(i) for i in ids)


def vision_spec(
    model: PreTrainedModel, source_dir: str | os.PathLike[str] | None
) -> VisionSpec | None:
    """The :class:`VisionSpec` of a Qwen2-VL-family model; None for a text model."""
    if not isinstance(model, _vlm_classes()):
        return None
    image = int(model.config.image_token_id)
    inner = model.model

    def rope_index(ids: torch.Tensor, grid: torch.Tensor | None) -> torch.Tensor:
        ids_1L = ids.reshape(1, -1)
        pos: torch.Tensor
        pos, _ = inner.get_rope_index(
            ids_1L, mm_token_type_ids=(ids_1L == image).int(), image_grid_thw=grid
        )
        return pos[:, 0]  # [3, L]

    banned = _banned(model, Path(source_dir) if source_dir is not None else None)
    return VisionSpec(image_token_id=image, banned_token_ids=banned, rope_index=rope_index)
