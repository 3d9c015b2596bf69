"""Images for VLLMEngine: vision-language prompts in vLLM's multi-modal input format.

Trajectories hold image placeholders *expanded* (one ``<|image_pad|>`` per vision-tower output
token, see :mod:`agentloop.vision`); vLLM's Qwen2-VL-family processors expand each single
``<|image_pad|>`` of a token prompt themselves. So the prompt sent is the trajectory's ids with
each placeholder run collapsed to one pad, plus the images; vLLM's expanded prompt must then
equal the trajectory's ids, or the sampled tokens would continue a sequence the trajectory does
not hold — :func:`check_expansion` makes that an error.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentloop.errors import InferenceError
from agentloop.vision import is_vision_model

if TYPE_CHECKING:
    from agentloop.vision import VisionProcessor

__all__ = ["check_expansion", "mm_prompt", "start_failure_hint"]


def start_failure_hint(model_dir: str | Path) -> str:
    """What to do when vLLM cannot start on ``model_dir``, where a known cause applies."""
    if is_vision_model(model_dir) and importlib.util.find_spec("torchvision") is None:
        return (
            "; the model is a vision-language model and torchvision is not installed, which "
            "vLLM's image processors import: install the torchvision build that matches torch "
            "(a GPU `pip install vllm` brings it; the CPU build needs torch's CPU wheel index), "
            "or run this model with HFEngine.from_pretrained(dir)"
        )
    return ""


def mm_prompt(
    vision: VisionProcessor | None, token_ids: list[int], images: Sequence[Any]
) -> dict[str, Any]:
    """vLLM's prompt for ``token_ids`` (placeholders expanded) and the ``images`` they show."""
    if not images:
        return {"prompt_token_ids": token_ids}
    if vision is None:
        raise InferenceError(
            f"got {len(images)} images but the engine's model is not a vision-language model "
            "(no vision_config in its config.json); serve a VLM, or drop images from the env"
        )
    collapsed = vision.collapse(token_ids)
    pads = collapsed.count(vision.tokens.image)
    if pads != len(images):
        raise InferenceError(
            f"the prompt has {pads} image placeholder runs for {len(images)} images; each image "
            "needs one run of <|image_pad|> tokens (TokenBuilder with a VisionProcessor makes them)"
        )
    return {"prompt_token_ids": collapsed, "multi_modal_data": {"image": list(images)}}


def check_expansion(sent: Sequence[int], expanded: Sequence[int] | None, request_id: str) -> None:
    """Raise unless vLLM's expanded prompt equals the trajectory's ids ``sent``."""
    if expanded is None or list(expanded) == list(sent):
        return
    raise InferenceError(
        f"vLLM expanded the images of request {request_id} to a {len(expanded)}-token prompt but "
        f"the trajectory has {len(sent)} tokens: its image processor uses another pixel budget "
        "than the TokenBuilder's VisionProcessor; give both the same min_pixels/max_pixels "
        "(vLLM: engine_args={'mm_processor_kwargs': {...}})"
    )
