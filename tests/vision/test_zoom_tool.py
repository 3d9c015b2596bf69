"""image_zoom_in: bbox validation and clamping, pixel-exact crops, the pixel budget, dispatch."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from agentloop.errors import ToolError
from agentloop.tools import ToolContext, Toolset
from agentloop.tools.zoom import (
    MIN_ZOOM_SIDE,
    clamp_bbox,
    crop_to_budget,
    image_zoom_in,
    set_current_image,
    zoom_tool,
)
from agentloop.types import ToolCall


def _noise(width: int = 640, height: int = 480) -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize(
    ("bbox", "expected"),
    [
        ([100, 50, 300, 200], (100, 50, 300, 200)),  # inside: unchanged
        ([-40, -10, 120, 90], (0, 0, 120, 90)),  # negative corner: clamped
        ([500, 400, 900, 700], (500, 400, 640, 480)),  # past the right/bottom edge: clamped
        ([-5, -5, 9999, 9999], (0, 0, 640, 480)),  # huge: the whole image
        ([100.4, 50.6, 299.5, 200.2], (100, 51, 300, 200)),  # floats are rounded
        ([200, 200, 205, 210], (188, 191, 216, 219)),  # tiny: widened around its centre to 28
        ([630, 470, 640, 480], (612, 452, 640, 480)),  # tiny in a corner: widened inwards
        ([10, 10, 10, 10], (0, 0, 28, 28)),  # a point: 28x28 inside the image
    ],
)
def test_bbox_is_clamped_and_widened(bbox: list[float], expected: tuple[int, ...]) -> None:
    assert clamp_bbox(bbox, 640, 480) == expected
    x1, y1, x2, y2 = expected
    assert x2 - x1 >= MIN_ZOOM_SIDE and y2 - y1 >= MIN_ZOOM_SIDE


@pytest.mark.parametrize(
    ("bbox", "message"),
    [
        ([300, 50, 100, 200], "reversed"),
        ([100, 200, 300, 50], "reversed"),
        ([700, 10, 800, 50], "outside the 640x480 image"),
        ([-90, -90, -10, -10], "outside the 640x480 image"),
        ([1, 2, 3], "4 numbers"),
        ([1, 2, 3, 4, 5], "4 numbers"),
        (["a", 2, 3, 4], "4 numbers"),
        ([True, 0, 30, 30], "4 numbers"),
        ([0, 0, float("nan"), 30], "4 numbers"),
        ("0 0 30 30", "4 numbers"),
    ],
)
def test_bad_boxes_are_named_errors(bbox: object, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        clamp_bbox(bbox, 640, 480)  # type: ignore[arg-type]


def test_tiny_image_widens_to_the_whole_axis() -> None:
    assert clamp_bbox([2, 2, 4, 4], 20, 100) == (0, 0, 20, 28)


def test_crop_is_pixel_exact_against_a_reference_slice() -> None:
    image = _noise()
    ref = np.asarray(image)
    for box in [(0, 0, 640, 480), (100, 50, 300, 200), (613, 1, 640, 29), (5, 400, 420, 480)]:
        crop = crop_to_budget(image, box, max_pixels=640 * 480)
        x1, y1, x2, y2 = box
        np.testing.assert_array_equal(np.asarray(crop), ref[y1:y2, x1:x2])


def test_crop_over_budget_is_scaled_down_with_its_aspect() -> None:
    image = _noise()
    crop = crop_to_budget(image, (0, 0, 640, 480), max_pixels=160 * 120)
    assert crop.size == (160, 120)
    expected = image.resize((160, 120), Image.Resampling.BICUBIC)
    np.testing.assert_array_equal(np.asarray(crop), np.asarray(expected))


async def test_zoom_through_dispatch_returns_an_image_observation() -> None:
    image = _noise()
    session = Toolset([image_zoom_in]).session()
    set_current_image(session.context, image)
    calls = [
        ToolCall("image_zoom_in", {"bbox_2d": [100, 50, 300, 200], "label": "cat"}, id="a"),
        ToolCall("image_zoom_in", {"bbox_2d": [300, 50, 100, 200]}, id="b"),
        ToolCall("image_zoom_in", {"bbox_2d": "here"}, id="c"),
    ]
    ok, reversed_, malformed = await session.dispatch(calls)
    await session.aclose()
    assert not ok.is_error and ok.content == "Zoomed in on [100, 50, 300, 200] (cat)."
    np.testing.assert_array_equal(np.asarray(ok.images[0]), np.asarray(image)[50:200, 100:300])
    message = ok.to_message()
    assert message.role == "tool" and len(message.images) == 1
    assert reversed_.error_kind == "tool_exception" and "reversed" in reversed_.content
    assert malformed.error_kind == "invalid_arguments" and "bbox_2d" in malformed.content
    assert not reversed_.images and not malformed.images


async def test_zoom_without_an_image_is_a_named_error() -> None:
    session = Toolset([image_zoom_in]).session()
    (result,) = await session.dispatch([ToolCall("image_zoom_in", {"bbox_2d": [0, 0, 9, 9]})])
    await session.aclose()
    assert result.is_error and "no image" in result.content


async def test_zoom_tool_budget_and_schema() -> None:
    small = zoom_tool(max_pixels=64 * 64)
    ctx = ToolContext()
    set_current_image(ctx, _noise())
    out = small.fn(bbox_2d=[0, 0, 640, 480], ctx=ctx)
    assert out.images[0].size == (73, 55) and "shown at 73x55" in out.text
    schema = small.schema["function"]
    assert schema["name"] == "image_zoom_in"
    assert schema["parameters"]["required"] == ["bbox_2d"]
    assert "ctx" not in schema["parameters"]["properties"]
    with pytest.raises(ToolError, match="max_pixels"):
        zoom_tool(min_side=28, max_pixels=100)
