"""agentloop/ZoomVQA-v0: a small detail on a large synthetic image, legible only after zooming.

Two layouts: ``scatter`` (a code or a count of dots in a small coloured panel somewhere among
distractor shapes) and ``grid`` (:mod:`agentloop.envs.zoom_grid`: the pattern in the panel of a
named cell of a 2x2 grid, the tiny DeepEyes demo's tasks). Two rewards: ``exact`` (1 for the
right ``\\boxed{}`` answer) and ``deepeyes`` (DeepEyes' ``0.8·acc − 0.2·format error +
1.2·[zoomed and right]``, :func:`agentloop.envs.deepeyes.deepeyes_reward`).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from typing import Any

from agentloop.envs.deepeyes import deepeyes_reward
from agentloop.envs.rewards import Reward, RewardFn, extract_boxed, last_assistant_text
from agentloop.envs.zoom_env import ZoomToolEnv
from agentloop.envs.zoom_grid import make_grid_task, render_grid_image
from agentloop.errors import EnvError
from agentloop.tools.zoom import MAX_ZOOM_PIXELS, MIN_ZOOM_SIDE, zoom_tool
from agentloop.types import Message, Task

__all__ = [
    "LAYOUTS",
    "REWARDS",
    "SYSTEM_PROMPT",
    "ZoomVQAEnv",
    "make_zoom_task",
    "render_zoom_image",
    "zoom_deepeyes_reward",
    "zoom_reward",
]

SYSTEM_PROMPT = (
    "You answer questions about an image. Small details are too small to read in the overview: "
    "call image_zoom_in with the pixel box of a region to see it at full resolution. Give the "
    "final answer as \\boxed{answer}."
)
_SPLITS = ("train", "test")
#: Task layouts and rewards (``ZoomVQAEnv(layout=..., reward=...)``).
LAYOUTS = ("scatter", "grid")
REWARDS = ("exact", "deepeyes")
_COLORS = {
    "red": (220, 40, 40),
    "blue": (40, 80, 220),
    "green": (30, 160, 60),
    "orange": (240, 140, 20),
    "purple": (140, 50, 180),
}
_SHAPES = ("circle", "square", "triangle")
_CODE_CHARS = "ACDEFHJKLMNPRTUVWXY34679"  # no look-alikes (0/O, 1/I, 5/S, 8/B)
_WIDTH, _HEIGHT = 1024, 768
_BOX = 56  # side of the panel that holds the detail


def make_zoom_task(split: str, index: int, layout: str = "scatter") -> Task:
    """Task ``index`` of ``split`` in ``layout`` (deterministic). ``data`` holds the question,
    the answer, the image size and the detail's box ``target_bbox``; :func:`render_zoom_image`
    draws the image."""
    if split not in _SPLITS:
        raise EnvError(f"ZoomVQA-v0 split {split!r} is unknown; use one of {_SPLITS}")
    if layout not in LAYOUTS:
        raise EnvError(f"ZoomVQA-v0 layout {layout!r} is unknown; use one of {LAYOUTS}")
    if layout == "grid":
        return make_grid_task(split, index)
    rng = random.Random(f"zoomvqa/{split}/{index}")
    color = rng.choice(sorted(_COLORS))
    x, y = rng.randrange(20, _WIDTH - _BOX - 20), rng.randrange(20, _HEIGHT - _BOX - 20)
    if rng.random() < 0.5:
        kind, answer = "code", "".join(rng.choice(_CODE_CHARS) for _ in range(3))
        question = f"What 3-character code is written inside the small {color} panel?"
    else:
        kind, answer = "dots", str(rng.randint(2, 7))
        question = f"How many white dots are inside the small {color} panel?"
    return Task(
        id=f"zoomvqa-{split}-{index:06d}",
        data={
            "prompt": f"{question} The image is {_WIDTH}x{_HEIGHT} pixels.",
            "answer": answer,
            "kind": kind,
            "color": color,
            "target_bbox": [x, y, x + _BOX, y + _BOX],
            "size": [_WIDTH, _HEIGHT],
            "seed": f"{split}/{index}",
        },
    )


def render_zoom_image(task: Task) -> Any:
    """The task's image (PIL, RGB), drawn from its data; the same task gives the same pixels."""
    if task.data["kind"] == "grid":
        return render_grid_image(task)
    return _render(
        task.id,
        task.data["seed"],
        task.data["kind"],
        task.data["color"],
        tuple(task.data["target_bbox"]),
        task.data["answer"],
    ).copy()


@functools.lru_cache(maxsize=16)
def _render(
    task_id: str, seed: str, kind: str, color: str, box: tuple[int, ...], answer: str
) -> Any:
    from PIL import Image, ImageDraw, ImageFont

    rng = random.Random(f"zoomvqa-image/{seed}")
    image = Image.new("RGB", (_WIDTH, _HEIGHT), (235, 232, 222))
    draw = ImageDraw.Draw(image)
    for _ in range(40):  # distractors: shapes of every colour, larger than the panel's content
        cx, cy, r = rng.randrange(_WIDTH), rng.randrange(_HEIGHT), rng.randrange(12, 40)
        fill = _COLORS[rng.choice(sorted(_COLORS))]
        shape = rng.choice(_SHAPES)
        if shape == "circle":
            draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=fill, width=3)
        elif shape == "square":
            draw.rectangle((cx - r, cy - r, cx + r, cy + r), outline=fill, width=3)
        else:
            draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], outline=fill)
    x1, y1, x2, y2 = box
    draw.rectangle((x1, y1, x2, y2), fill=_COLORS[color])
    if kind == "code":
        font = ImageFont.load_default(size=14)
        draw.text(
            ((x1 + x2) / 2, (y1 + y2) / 2), answer, fill=(255, 255, 255), font=font, anchor="mm"
        )
    else:
        for i in range(int(answer)):
            dx, dy = 10 + (i % 4) * 12, 16 + (i // 4) * 14
            draw.ellipse((x1 + dx - 3, y1 + dy - 3, x1 + dx + 3, y1 + dy + 3), fill=(255, 255, 255))
    return image


def _normalize(text: str | None) -> str:
    return "".join((text or "").split()).upper().removeprefix("\\TEXT{").removesuffix("}")


def _covers(call_box: Any, target: Sequence[int]) -> bool:
    try:
        x1, y1, x2, y2 = (float(v) for v in call_box)
    except (TypeError, ValueError):
        return False
    return x1 <= target[0] and y1 <= target[1] and x2 >= target[2] and y2 >= target[3]


def zoom_reward(task: Task, messages: Sequence[Message]) -> Reward:
    """1.0 for the exact answer in the last ``\\boxed{}`` (case and spaces ignored), with format
    metrics (``has_boxed``) and tool-use metrics (``zoom_calls``, ``zoom_on_target``: a zoom box
    that contains the detail's panel)."""
    boxed = extract_boxed(last_assistant_text(messages))
    correct = boxed is not None and _normalize(boxed) == _normalize(task.data["answer"])
    calls = [c for m in messages if m.role == "assistant" for c in m.tool_calls]
    zooms = [c for c in calls if c.name == "image_zoom_in"]
    target = task.data["target_bbox"]
    on_target = any(_covers(c.arguments.get("bbox_2d"), target) for c in zooms)
    return Reward(
        float(correct),
        {
            "correct": float(correct),
            "has_boxed": float(boxed is not None),
            "zoom_calls": float(len(zooms)),
            "used_zoom": float(bool(zooms)),
            "zoom_on_target": float(on_target),
        },
    )


async def zoom_deepeyes_reward(task: Task, messages: Sequence[Message]) -> Reward:
    """DeepEyes' reward (:func:`~agentloop.envs.deepeyes.deepeyes_reward`, rule-based) on a
    ZoomVQA task, with ZoomVQA's tool-use metrics beside its parts (``used_tool``: a zoom
    returned an image; ``zoom_on_target``: a zoom box covered the detail's panel)."""
    reward = await deepeyes_reward(task, messages)
    tool = zoom_reward(task, messages).metrics
    metrics = {
        **reward.metrics,
        "used_tool": float(reward.metrics["zoom_calls"] > 0),
        "zoom_on_target": tool["zoom_on_target"],
    }
    return Reward(reward.value, metrics, reward.verdict)


class ZoomVQAEnv(ZoomToolEnv):
    """Questions about a detail of a large synthetic image (``layout``: ``scatter``, a
    3-character code or a count of dots in a small coloured panel of a 1024x768 image; ``grid``,
    :mod:`~agentloop.envs.zoom_grid`). The user turn carries the image; ``image_zoom_in`` crops
    it (``min_side`` / ``max_pixels`` set the crop limits). ``reward``: ``exact`` or
    ``deepeyes`` (the module docstring)."""

    def __init__(
        self,
        *,
        max_turns: int | None = None,
        min_side: int = MIN_ZOOM_SIDE,
        max_pixels: int = MAX_ZOOM_PIXELS,
        layout: str = "scatter",
        reward: str = "exact",
    ) -> None:
        if layout not in LAYOUTS or reward not in REWARDS:
            raise EnvError(
                f"ZoomVQA-v0 layout={layout!r}, reward={reward!r}: use a layout of {LAYOUTS} "
                f"and a reward of {REWARDS}"
            )
        self.layout = layout
        tools = [zoom_tool(min_side=min_side, max_pixels=max_pixels)]
        fn: RewardFn = zoom_deepeyes_reward if reward == "deepeyes" else zoom_reward
        super().__init__(tools, fn, system_prompt=SYSTEM_PROMPT, max_turns=max_turns)

    def prompt(self, task: Task) -> list[Message]:
        image = render_zoom_image(task)
        return [
            Message("system", SYSTEM_PROMPT),
            Message("user", task.data["prompt"], images=(image,)),
        ]

    def tasks(self, split: str = "train", limit: int | None = None) -> list[Task]:
        n = limit if limit is not None else 10_000
        return [make_zoom_task(split, i, self.layout) for i in range(n)]

    def sample_task(self, seed: int | None) -> Task:
        return make_zoom_task("train", seed or 0, self.layout)
