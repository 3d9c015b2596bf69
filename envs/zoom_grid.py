"""ZoomVQA's ``layout="grid"`` tasks: a letter in one of nine small panels, read only by zooming.

A 1008x1008 image holds a 3x3 grid of cells; each cell has a small grey panel near its centre
with a letter drawn in it. The question names the cell ("row 2, column 3"); the answer is its
letter. Eight other panels hold other letters, so a model must zoom on the named panel: at an
overview a VLM's processor shrinks the image by 4-6x and the 32-px letters to a few pixels,
while a zoom on the panel's box shows it at full resolution. The panels sit a few pixels off
their cell's centre (seeded per task), so the exact box varies while a box per cell still
covers its panel (``PANEL_BOXES``: what a scripted expert zooms to).
"""

from __future__ import annotations

import functools
import random
from typing import Any

from agentloop.types import Task

__all__ = [
    "GRID",
    "GRID_LETTERS",
    "GRID_SIZE",
    "PANEL_BOXES",
    "make_grid_task",
    "render_grid_image",
]

GRID = 3
GRID_SIZE = 1008  # the image's side, in pixels
_CELL = GRID_SIZE // GRID
_PANEL = 56  # a panel's side
_JITTER = 8  # how far a panel's centre may sit off its cell's centre
_ZOOM = _PANEL + 2 * _JITTER  # the side of a box per cell that covers its panel wherever it is
#: Letters without look-alikes among them, none a multiple-choice letter (A-J).
GRID_LETTERS = "KLMNPRTUXY"
#: ``(row, col)`` (1-based) → the box ``[x1, y1, x2, y2]`` that covers that cell's panel.
PANEL_BOXES: dict[tuple[int, int], list[int]] = {
    (r + 1, c + 1): [
        c * _CELL + (_CELL - _ZOOM) // 2,
        r * _CELL + (_CELL - _ZOOM) // 2,
        c * _CELL + (_CELL + _ZOOM) // 2,
        r * _CELL + (_CELL + _ZOOM) // 2,
    ]
    for r in range(GRID)
    for c in range(GRID)
}


def make_grid_task(split: str, index: int) -> Task:
    """Grid task ``index`` of ``split`` (deterministic; the split is checked by the caller)."""
    rng = random.Random(f"zoomgrid/{split}/{index}")
    letters = [rng.choice(GRID_LETTERS) for _ in range(GRID * GRID)]
    row, col = rng.randint(1, GRID), rng.randint(1, GRID)
    offsets = [(rng.randint(-_JITTER, _JITTER), rng.randint(-_JITTER, _JITTER)) for _ in letters]
    k = (row - 1) * GRID + col - 1
    cx = (col - 1) * _CELL + _CELL // 2 + offsets[k][0]
    cy = (row - 1) * _CELL + _CELL // 2 + offsets[k][1]
    half = _PANEL // 2
    return Task(
        id=f"zoomgrid-{split}-{index:06d}",
        data={
            "prompt": (
                f"What letter is written in the panel at row {row}, column {col}? The image is "
                f"{GRID_SIZE}x{GRID_SIZE} pixels, a {GRID}x{GRID} grid of panels."
            ),
            "answer": letters[k],
            "kind": "grid",
            "cell": [row, col],
            "letters": "".join(letters),
            "offsets": [list(o) for o in offsets],
            "target_bbox": [cx - half, cy - half, cx + half, cy + half],
            "size": [GRID_SIZE, GRID_SIZE],
            "seed": f"{split}/{index}",
        },
    )


def render_grid_image(task: Task) -> Any:
    """The grid task's image (PIL, RGB); the same task gives the same pixels."""
    offsets = tuple((int(dx), int(dy)) for dx, dy in task.data["offsets"])
    return _render(task.data["letters"], offsets).copy()


@functools.lru_cache(maxsize=16)
def _render(letters: str, offsets: tuple[tuple[int, int], ...]) -> Any:
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (GRID_SIZE, GRID_SIZE), (235, 232, 222))
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=32)
    half = _PANEL // 2
    for k, (letter, (dx, dy)) in enumerate(zip(letters, offsets, strict=True)):
        row, col = divmod(k, GRID)
        cx, cy = col * _CELL + _CELL // 2 + dx, row * _CELL + _CELL // 2 + dy
        draw.rectangle((cx - half, cy - half, cx + half, cy + half), fill=(70, 70, 80))
        draw.text((cx, cy), letter, fill=(255, 255, 255), font=font, anchor="mm")
    return image
