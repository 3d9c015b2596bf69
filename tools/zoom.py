"""image_zoom_in: crop the episode's current image to a bounding box (DeepEyes-style zoom)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from agentloop.errors import ToolError
from agentloop.tools.context import ToolContext
from agentloop.tools.tool import Tool, tool
from agentloop.tools.toolset import ToolOutput

__all__ = [
    "CURRENT_IMAGE",
    "MAX_ZOOM_PIXELS",
    "MIN_ZOOM_SIDE",
    "clamp_bbox",
    "crop_to_budget",
    "current_image",
    "image_zoom_in",
    "set_current_image",
    "zoom_tool",
]

#: ``ToolContext.state`` key of the image that ``image_zoom_in`` crops.
CURRENT_IMAGE = "image_zoom_in.image"
#: Shortest side of a crop: a Qwen-VL merged patch is 28x28 px; a smaller box is widened.
MIN_ZOOM_SIDE = 28
#: Pixel budget of a returned crop; a larger crop is scaled down to fit (aspect kept).
MAX_ZOOM_PIXELS = 448 * 448


def set_current_image(ctx: ToolContext, image: Any) -> None:
    """Make ``image`` (PIL) the one ``image_zoom_in`` crops in this episode."""
    ctx.state[CURRENT_IMAGE] = image


def current_image(ctx: ToolContext) -> Any:
    """The episode's current image: set with :func:`set_current_image`, else the task's
    ``data["image"]``. A ``ToolError`` for the model if there is none."""
    image = ctx.state.get(CURRENT_IMAGE)
    if image is None and ctx.task is not None:
        image = getattr(ctx.task, "data", {}).get("image")
    if image is None:
        raise ToolError("there is no image in this conversation to zoom into")
    return image


def _check_box(bbox: Sequence[Any]) -> tuple[int, int, int, int]:
    if isinstance(bbox, str | bytes) or len(bbox) != 4:
        raise ToolError(f"bbox_2d must be 4 numbers [x1, y1, x2, y2], got {bbox!r}")
    out = []
    for v in bbox:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ToolError(f"bbox_2d must be 4 numbers [x1, y1, x2, y2], got {list(bbox)!r}")
        out.append(round(v))
    x1, y1, x2, y2 = out
    if x1 > x2 or y1 > y2:
        raise ToolError(
            f"bbox_2d {list(bbox)} is reversed (x1 > x2 or y1 > y2); give [x1, y1, x2, y2] with "
            "(x1, y1) the top-left and (x2, y2) the bottom-right corner"
        )
    return x1, y1, x2, y2


def _widen(lo: int, hi: int, size: int, min_side: int) -> tuple[int, int]:
    """Grow ``[lo, hi)`` around its centre to ``min_side`` (or the whole axis), inside ``size``."""
    side = min(min_side, size)
    if hi - lo >= side:
        return lo, hi
    lo = max(0, min((lo + hi - side) // 2, size - side))
    return lo, lo + side


def clamp_bbox(
    bbox: Sequence[Any], width: int, height: int, *, min_side: int = MIN_ZOOM_SIDE
) -> tuple[int, int, int, int]:
    """A valid crop box ``(left, top, right, bottom)`` for a ``width`` x ``height`` image.

    Coordinates are rounded and clamped into the image (a negative or too-large corner is
    fine); a box narrower or shorter than ``min_side`` is widened around its centre. A
    malformed box, a reversed one, or one entirely outside the image is a ``ToolError`` that
    says what to send instead.
    """
    x1, y1, x2, y2 = _check_box(bbox)
    cx1, cx2 = min(max(x1, 0), width), min(max(x2, 0), width)
    cy1, cy2 = min(max(y1, 0), height), min(max(y2, 0), height)
    if x2 < 0 or y2 < 0 or x1 > width or y1 > height:
        raise ToolError(
            f"bbox_2d {list(bbox)} lies outside the {width}x{height} image; coordinates are "
            f"pixels with x in [0, {width}] and y in [0, {height}]"
        )
    cx1, cx2 = _widen(cx1, cx2, width, min_side)
    cy1, cy2 = _widen(cy1, cy2, height, min_side)
    return cx1, cy1, cx2, cy2


def crop_to_budget(image: Any, box: tuple[int, int, int, int], *, max_pixels: int) -> Any:
    """``image.crop(box)``, scaled down (bicubic, aspect kept) if it has more than
    ``max_pixels`` pixels; pixel-exact otherwise."""
    crop = image.crop(box)
    w, h = crop.size
    if w * h <= max_pixels:
        return crop
    scale = math.sqrt(max_pixels / (w * h))
    size = (max(1, math.floor(w * scale)), max(1, math.floor(h * scale)))
    from PIL import Image

    return crop.resize(size, Image.Resampling.BICUBIC)


def _zoom(min_side: int, max_pixels: int) -> Callable[..., Any]:
    def image_zoom_in(bbox_2d: list[int], ctx: ToolContext, label: str | None = None) -> Any:
        """Zoom in on a region of the image to see its details at full resolution.

        Args:
            bbox_2d: The region as [x1, y1, x2, y2] in pixels of the original image: (x1, y1)
                is the top-left corner, (x2, y2) the bottom-right one.
            label: Optional name of what is in the region.
        """
        image = current_image(ctx)
        box = clamp_bbox(bbox_2d, *image.size, min_side=min_side)
        crop = crop_to_budget(image, box, max_pixels=max_pixels)
        text = f"Zoomed in on [{', '.join(map(str, box))}]" + (f" ({label})" if label else "")
        if crop.size != (box[2] - box[0], box[3] - box[1]):
            text += f", shown at {crop.size[0]}x{crop.size[1]}"
        return ToolOutput(text + ".", (crop,))

    return image_zoom_in


_TEMPLATE = tool(name="image_zoom_in", timeout_s=10.0)(_zoom(MIN_ZOOM_SIDE, MAX_ZOOM_PIXELS))
#: The default zoom tool (28 px minimum side, 448x448 pixel budget).
image_zoom_in = _TEMPLATE


def zoom_tool(
    *, min_side: int = MIN_ZOOM_SIDE, max_pixels: int = MAX_ZOOM_PIXELS, name: str = "image_zoom_in"
) -> Tool:
    """An ``image_zoom_in`` tool with its own minimum crop side and pixel budget."""
    if min_side < 1 or max_pixels < min_side * min_side:
        raise ToolError(
            f"zoom_tool(min_side={min_side}, max_pixels={max_pixels}): need min_side >= 1 and "
            "max_pixels >= min_side**2"
        )
    return dataclasses.replace(_TEMPLATE, name=name, fn=_zoom(min_side, max_pixels))
