"""ZoomVQA's ``layout="grid"`` tasks: the pattern in one of four small panels, seen only by zooming.

A 1008x1008 image holds a 2x2 grid of cells; each cell has a 112-px panel at its centre, framed,
filled with one of four fine black-and-white patterns (``GRID_PATTERNS``: 1-px stripes, 1-px
bars, a 1-px checkerboard, a 2-px checkerboard). The question names the cell ("row 2,
column 1"); the answer is its pattern's name. Every pattern is half dark and half light, so at
the overview a VLM's processor makes of the image (shrunk 6x) each panel is the same flat grey,
whatever its pattern; a zoom on the panel's box (``PANEL_BOXES``: what a scripted expert zooms
to) shows it pixel for pixel. The panels sit on multiples of 28 px, a merged vision patch, so a
crop of the box reaches the vision tower unresampled; the patterns are fixed to the image's
pixel grid, so a pattern always looks the same in its crop.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

from agentloop.types import Task

__all__ = [
    "GRID",
    "GRID_PATTERNS",
    "GRID_SIZE",
    "PANEL_BOXES",
    "make_grid_task",
    "pattern_at",
    "render_grid_image",
]

GRID = 2
GRID_SIZE = 1008  # the image's side, in pixels
_CELL = GRID_SIZE // GRID
_PANEL = 112  # a panel's side: 4 merged patches
_FRAME = 6  # the dark frame around a panel (visible at the overview: where the panels are)
_DARK, _LIGHT = (40, 40, 48), (228, 226, 218)
#: Pattern names → whether pixel (x, y) is dark; each is dark on half the pixels of any
#: 4x4 block, so all four shrink to the same grey.
_PATTERNS: dict[str, Callable[[int, int], bool]] = {
    "stripes": lambda x, y: y % 2 == 0,
    "bars": lambda x, y: x % 2 == 0,
    "checks": lambda x, y: (x + y) % 2 == 0,
    "tiles": lambda x, y: (x // 2 + y // 2) % 2 == 0,
}
GRID_PATTERNS = tuple(_PATTERNS)
#: ``(row, col)`` (1-based) → the box ``[x1, y1, x2, y2]`` of that cell's panel.
PANEL_BOXES: dict[tuple[int, int], list[int]] = {
    (r + 1, c + 1): [
        c * _CELL + (_CELL - _PANEL) // 2,
        r * _CELL + (_CELL - _PANEL) // 2,
        c * _CELL + (_CELL + _PANEL) // 2,
        r * _CELL + (_CELL + _PANEL) // 2,
    ]
    for r in range(GRID)
    for c in range(GRID)
}


def make_grid_task(split: str, index: int) -> Task:
    """Grid task ``index`` of ``split`` (deterministic; the split is checked by the caller)."""
    rng = random.Random(f"zoomgrid/{split}/{index}")
    patterns = [rng.choice(GRID_PATTERNS) for _ in range(GRID * GRID)]
    row, col = rng.randint(1, GRID), rng.randint(1, GRID)
    names = ", ".join(GRID_PATTERNS[:-1]) + f" or {GRID_PATTERNS[-1]}"
    return Task(
        id=f"zoomgrid-{split}-{index:06d}",
        data={
            "prompt": (
                f"Which pattern fills the panel at row {row}, column {col}: {names}? The image "
                f"is {GRID_SIZE}x{GRID_SIZE} pixels, a {GRID}x{GRID} grid of panels."
            ),
            "answer": patterns[(row - 1) * GRID + col - 1],
            "kind": "grid",
            "cell": [row, col],
            "patterns": patterns,
            "target_bbox": PANEL_BOXES[(row, col)],
            "size": [GRID_SIZE, GRID_SIZE],
            "seed": f"{split}/{index}",
        },
    )


def pattern_at(task: Task, cell: tuple[int, int]) -> str:
    """The name of the pattern in ``cell`` (1-based ``(row, col)``) of grid task ``task``."""
    return str(task.data["patterns"][(cell[0] - 1) * GRID + cell[1] - 1])


def render_grid_image(task: Task) -> Any:
    """The grid task's image (PIL, RGB); the same task gives the same pixels."""
    return _render(tuple(task.data["patterns"])).copy()


@functools.lru_cache(maxsize=4)
def _tile(name: str) -> Any:
    from PIL import Image

    tile = Image.new("RGB", (_PANEL, _PANEL))
    dark = _PATTERNS[name]
    tile.putdata([_DARK if dark(x, y) else _LIGHT for y in range(_PANEL) for x in range(_PANEL)])
    return tile


@functools.lru_cache(maxsize=16)
def _render(patterns: tuple[str, ...]) -> Any:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (GRID_SIZE, GRID_SIZE), (235, 232, 222))
    draw = ImageDraw.Draw(image)
    for k, name in enumerate(patterns):
        row, col = divmod(k, GRID)
        x1, y1, x2, y2 = PANEL_BOXES[(row + 1, col + 1)]
        draw.rectangle((x1 - _FRAME, y1 - _FRAME, x2 + _FRAME - 1, y2 + _FRAME - 1), fill=_DARK)
        image.paste(_tile(name), (x1, y1))  # the box's corners are even: the phase is the image's
    return image
