"""Images for Qwen2-VL-family models: grids, placeholder expansion and checks, model inputs.

A chat template renders each image as ``<|vision_start|><|image_pad|><|vision_end|>``: one pad.
The model needs one pad per merged patch of the image, so after encoding, each pad is expanded to
``t * h * w / merge_size**2`` copies, where ``(t, h, w)`` is the image's patch grid after the
processor's resize (:meth:`VisionProcessor.grid`, computed from the image size alone). Nothing
here needs torchvision: pixels come from the model's own ``AutoImageProcessor`` (its PIL backend).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop.errors import TemplateError, TrajectoryError

__all__ = [
    "IMAGE_PAD",
    "VISION_TOKENS",
    "VisionProcessor",
    "VisionTokens",
    "check_image_placeholders",
    "image_spans",
    "is_vision_model",
    "truncate_with_images",
    "vision_of",
]

IMAGE_PAD = "<|image_pad|>"
#: The special tokens of the Qwen2-VL family's vision markup; the model must never sample them.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", IMAGE_PAD, "<|video_pad|>")


@dataclass(frozen=True, slots=True)
class VisionTokens:
    """Token ids of the vision markup: ``image`` is the pad that expands; ``banned`` are all the
    vision ids, which a sampler must exclude (the model may only *read* them)."""

    image: int
    banned: tuple[int, ...]


def _tokens_of(tokenizer: Any) -> VisionTokens:
    vocab = tokenizer.get_vocab()
    missing = [t for t in (IMAGE_PAD, "<|vision_start|>", "<|vision_end|>") if t not in vocab]
    if missing:
        raise TemplateError(
            f"the tokenizer has no {missing} tokens; a Qwen2-VL-family tokenizer is needed for "
            "images (make one with `agentloop make-tiny-model --vision DIR`)"
        )
    return VisionTokens(vocab[IMAGE_PAD], tuple(vocab[t] for t in VISION_TOKENS if t in vocab))


class VisionProcessor:
    """The model's image processor plus its vision tokens.

    ``image_processor`` is a Qwen2-VL image processor (``AutoImageProcessor`` of the model; the
    PIL backend works without torchvision). ``min_pixels`` / ``max_pixels`` override its pixel
    budget (fewer pixels, fewer image tokens).
    """

    def __init__(
        self,
        image_processor: Any,
        tokenizer: Any,
        *,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
    ) -> None:
        self.image_processor = image_processor
        self.tokens = _tokens_of(tokenizer)
        self.patch_size = int(image_processor.patch_size)
        self.merge_size = int(image_processor.merge_size)
        self.temporal_patch_size = int(image_processor.temporal_patch_size)
        size = image_processor.size
        self.min_pixels = int(min_pixels or size["shortest_edge"])
        self.max_pixels = int(max_pixels or size["longest_edge"])
        if not 0 < self.min_pixels <= self.max_pixels:
            raise TemplateError(
                f"min_pixels={self.min_pixels} and max_pixels={self.max_pixels}: need "
                "0 < min_pixels <= max_pixels"
            )

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike[str], *, tokenizer: Any = None, **pixels: int | None
    ) -> VisionProcessor:
        """The processor saved with a model directory (``preprocessor_config.json``)."""
        from transformers import AutoImageProcessor, AutoTokenizer

        processor = AutoImageProcessor.from_pretrained(path)
        return cls(processor, tokenizer or AutoTokenizer.from_pretrained(path), **pixels)

    # -- sizes -----------------------------------------------------------------------------

    def grid(self, image: Any) -> tuple[int, int, int]:
        """The image's patch grid ``(t, h, w)`` after the processor's resize."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        width, height = image.size
        h, w = smart_resize(
            height,
            width,
            factor=self.patch_size * self.merge_size,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
        )
        return (1, h // self.patch_size, w // self.patch_size)

    def num_tokens(self, grid: Sequence[int]) -> int:
        """Placeholder tokens for one image of patch grid ``grid``."""
        t, h, w = grid
        return t * h * w // self.merge_size**2

    # -- token ids ---------------------------------------------------------------------------

    def expand(self, ids: Sequence[int], images: Sequence[Any]) -> list[int]:
        """Replace the i-th image pad in ``ids`` with the placeholder run of ``images[i]``."""
        pad = self.tokens.image
        found = sum(1 for i in ids if i == pad)
        if found != len(images):
            raise TemplateError(
                f"the chat template rendered {found} image placeholders for {len(images)} images; "
                "its content-part handling must emit one <|image_pad|> per image part"
            )
        if not images:
            return list(ids)
        runs = iter([pad] * self.num_tokens(self.grid(im)) for im in images)
        out: list[int] = []
        for i in ids:
            if i == pad:
                out.extend(next(runs))
            else:
                out.append(i)
        return out

    def collapse(self, ids: Iterable[int]) -> list[int]:
        """The inverse of :meth:`expand`: each run of image pads back to one pad (for decoding)."""
        pad, out = self.tokens.image, list[int]()
        for i in ids:
            if not (i == pad and out and out[-1] == pad):
                out.append(i)
        return out

    # -- model inputs ----------------------------------------------------------------------------

    def pixel_inputs(self, images: Sequence[Any]) -> dict[str, Any]:
        """``pixel_values`` and ``image_grid_thw`` for ``images``, from the image processor."""
        out = self.image_processor(
            images=[im.convert("RGB") for im in images],
            return_tensors="pt",
            size={"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
        )
        grids = [tuple(int(v) for v in g) for g in out["image_grid_thw"].tolist()]
        expected = [self.grid(im) for im in images]
        if grids != expected:  # the token count must agree with what the vision tower emits
            raise TemplateError(f"image processor grids {grids} differ from expected {expected}")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}

    def model_inputs(self, token_ids: Sequence[int], images: Sequence[Any]) -> dict[str, Any]:
        """Keyword arguments for a Qwen2-VL-family model's ``forward``/``generate`` on one
        sequence: ``input_ids`` ``[1, T]``, ``mm_token_type_ids`` (1 at image pads), and the
        pixel inputs. The placeholder runs are checked against the images' grids first."""
        import torch

        grids = [self.grid(im) for im in images]
        check_image_placeholders(
            token_ids, grids, image_token_id=self.tokens.image, merge_size=self.merge_size
        )
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long)
        inputs: dict[str, Any] = {
            "input_ids": input_ids,
            "mm_token_type_ids": (input_ids == self.tokens.image).int(),
        }
        if images:
            inputs.update(self.pixel_inputs(images))
        return inputs


def image_spans(token_ids: Sequence[int], image_token_id: int) -> list[tuple[int, int]]:
    """``(start, end)`` of every run of ``image_token_id`` in ``token_ids``, in order."""
    spans, start = [], None
    for i, tok in enumerate(token_ids):
        if tok == image_token_id and start is None:
            start = i
        elif tok != image_token_id and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(token_ids)))
    return spans


def check_image_placeholders(
    token_ids: Sequence[int],
    grids: Sequence[Sequence[int]],
    *,
    image_token_id: int,
    merge_size: int,
) -> None:
    """Raise :class:`TrajectoryError` unless ``token_ids`` hold exactly one placeholder run per
    grid, in order, each ``t * h * w / merge_size**2`` long."""
    spans = image_spans(token_ids, image_token_id)
    if len(spans) != len(grids):
        raise TrajectoryError(
            f"{len(spans)} image placeholder runs in the token ids but {len(grids)} image grids; "
            "every image needs exactly one run of placeholder tokens"
        )
    for k, ((start, end), grid) in enumerate(zip(spans, grids, strict=True)):
        t, h, w = grid
        want, rem = divmod(t * h * w, merge_size**2)
        if rem or end - start != want:
            raise TrajectoryError(
                f"image {k}: {end - start} placeholder tokens at [{start}, {end}) but its grid "
                f"{tuple(grid)} needs {t * h * w / merge_size**2:g} (t*h*w / merge_size^2)"
            )


def truncate_with_images(
    token_ids: Sequence[int], max_len: int, image_token_id: int
) -> tuple[int, int]:
    """Where to cut ``token_ids`` to at most ``max_len`` tokens without splitting an image.

    Returns ``(length, images_kept)``: an image whose placeholder run would be cut is dropped
    whole, together with the vision-start token just before it, so the cut lands before it.
    """
    if max_len < 0:
        raise TrajectoryError(f"max_len must be >= 0, got {max_len}")
    length = min(max_len, len(token_ids))
    kept = 0
    for start, end in image_spans(token_ids, image_token_id):
        if end <= length:
            kept += 1
        elif start < length or (start == length and length > 0):
            # Cut before the image's <|vision_start|> as well: a start marker with no image
            # behind it is not a sequence the model was ever shown.
            return max(start - 1, 0), kept
        else:
            break
    return length, kept


def is_vision_model(model_dir: str | os.PathLike[str]) -> bool:
    """Whether the model directory holds a vision-language model (its config has a vision part)."""
    config = Path(model_dir) / "config.json"
    if not config.is_file():
        return False
    return "vision_config" in json.loads(config.read_text())


def vision_of(model_dir: str | os.PathLike[str]) -> VisionProcessor | None:
    """The model's :class:`VisionProcessor`, or None for a text-only model."""
    return VisionProcessor.from_pretrained(model_dir) if is_vision_model(model_dir) else None
