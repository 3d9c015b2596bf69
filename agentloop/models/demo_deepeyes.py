"""The tiny DeepEyes demo's own pieces: its settings, base model and scripted-expert SFT traces.

The tasks are ZoomVQA-v0's ``grid`` layout (:mod:`agentloop.envs.zoom_grid`): the pattern in
the panel of a named cell of a 2x2 grid, a flat grey at the overview the model first sees and
plain in a zoom on the panel. The scripted expert plays the real env: it zooms on the named
cell's panel box (:data:`~agentloop.envs.zoom_grid.PANEL_BOXES`) and answers the pattern the
crop shows, with the crop's pixels in the trace. Imperfect on purpose, as the ReTool demo's
typos are: a ``wrong_box_rate`` share of its episodes zoom on another cell (and answer that
cell's pattern), a ``no_zoom_rate`` share answer a guess without zooming. The cold-start SFT
copies those habits; GRPO with DeepEyes' reward (the tool bonus only with a right answer)
unlearns them.

The base model is the tiny Qwen2.5-VL (:mod:`agentloop.models.tiny_vlm`) with an image
processor of ``max_image_tokens`` merged patches: the 1008-px overview becomes 36 tokens
(168 px, a sixth of its size), a zoom on a panel 16 (112 px, unresampled).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop.errors import ConfigError
from agentloop.models.demo_config import DemoConfig, DemoConfigs, DemoFamily, override

__all__ = [
    "DEEPEYES",
    "ENV",
    "ENV_KWARGS",
    "ZoomDemoConfig",
    "deepeyes_base_dir",
    "expert_rows",
    "make_deepeyes_traces",
]

ENV = "agentloop/ZoomVQA-v0"
#: The demo's env: grid tasks, DeepEyes' reward, the rollout's turn limit.
ENV_KWARGS = {"layout": "grid", "reward": "deepeyes", "max_turns": 3}
_PATCH = 28  # a merged patch of the Qwen2-VL processor, in pixels


@dataclass(frozen=True)
class ZoomDemoConfig(DemoConfig):
    """The DeepEyes demo's settings (``demo:`` of ``tiny_deepeyes/demo.yaml``). Traces:
    ``num_traces`` scripted-expert episodes of train tasks as a rollout sees them (the tool's
    schema in the system turn) and ``num_compact`` more without it (a third of the tokens: the
    zoom and reading skills form at a third of the cost, as the ReTool demo's compact rows do),
    ``wrong_box_rate`` of them zooming on another cell, ``no_zoom_rate`` answering a guess
    unzoomed. ``max_image_tokens``: the
    base model's pixel budget per image, in merged 28x28 patches. ``min_gain``: the pass@1 gain
    the report calls a pass, with the paired 95% CI above zero."""

    num_traces: int = 400
    num_compact: int = 1600
    wrong_box_rate: float = 0.1
    no_zoom_rate: float = 0.3
    max_image_tokens: int = 36

    def __post_init__(self) -> None:
        super().__post_init__()
        rates = (self.wrong_box_rate, self.no_zoom_rate)
        if not all(0.0 <= r <= 1.0 for r in rates) or sum(rates) > 1.0:
            raise ConfigError(
                f"demo.wrong_box_rate={self.wrong_box_rate} and demo.no_zoom_rate="
                f"{self.no_zoom_rate} must each be in [0, 1] and sum to at most 1"
            )
        if self.num_traces < 1 or self.num_compact < 0 or self.max_image_tokens < 4:
            raise ConfigError(
                f"demo.num_traces={self.num_traces} (>= 1), demo.num_compact={self.num_compact} "
                f"(>= 0), demo.max_image_tokens="
                f"{self.max_image_tokens} (>= 4)"
            )


def _base_path(demo: ZoomDemoConfig) -> Path:
    """Where :func:`deepeyes_base_dir` keeps the base model (built there or not)."""
    from agentloop.models.tiny_vlm import DEFAULT_VLM_CACHE_DIR, VLM_ENV_VAR

    vlm = Path(os.environ.get(VLM_ENV_VAR) or DEFAULT_VLM_CACHE_DIR).expanduser()
    return vlm.parent / f"{vlm.name}-px{demo.max_image_tokens}"


def deepeyes_base_dir(demo: ZoomDemoConfig) -> Path:
    """The random-init tiny VLM with the demo's pixel budget, built once next to the tiny VLM."""
    from agentloop.cache import cached_build
    from agentloop.models.tiny_vlm import tiny_vlm_dir

    vlm = tiny_vlm_dir()
    target = _base_path(demo)

    def build(out: Path) -> None:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        for f in vlm.iterdir():
            if f.is_file() and f.name != "preprocessor_config.json":
                shutil.copy2(f, out / f.name)
        budget = demo.max_image_tokens * _PATCH * _PATCH
        Qwen2VLImageProcessorPil(min_pixels=4 * _PATCH * _PATCH, max_pixels=budget).save_pretrained(
            out
        )

    return cached_build(target, build)


def _data_uri(image: Any) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _row_message(m: Any) -> dict[str, Any]:
    """A message as an SFT row writes it: images as data-URI parts before the text."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.images:
        parts = [{"type": "image", "image": _data_uri(im)} for im in m.images]
        out["content"] = [*parts, {"type": "text", "text": m.content}]
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "function": {"name": c.name, "arguments": dict(c.arguments)}}
            for c in m.tool_calls
        ]
    for key in ("tool_call_id", "name"):
        if getattr(m, key) is not None:
            out[key] = getattr(m, key)
    return out


async def _episode(
    env: Any, task: Any, habit: str, rng: random.Random, *, tools: bool
) -> dict[str, Any]:
    """One scripted episode through the env: zoom (on the named cell, or on another) and
    answer the crop's pattern, or (``habit == "guess"``) answer a random pattern unzoomed."""
    from agentloop.envs.zoom_grid import GRID_PATTERNS, PANEL_BOXES, pattern_at
    from agentloop.types import Message, ToolCall

    messages, _ = await env.reset(options={"task": task})
    cell = tuple(task.data["cell"])
    history = list(messages)
    if habit == "guess":
        answer = rng.choice(GRID_PATTERNS)
    else:
        if habit == "wrong_box":
            cell = rng.choice([c for c in PANEL_BOXES if c != cell])
        call = ToolCall("image_zoom_in", {"bbox_2d": PANEL_BOXES[cell]}, id="call_0")
        action = Message("assistant", "", (call,))
        step = await env.step(action)
        history += [action, *step.observation]
        answer = pattern_at(task, cell)
    final = Message("assistant", f"\\boxed{{{answer}}}")
    result = await env.step(final)
    assert result.terminated, "an answer without a tool call ends a ZoomVQA episode"
    history.append(final)
    return {
        "messages": [_row_message(m) for m in history],
        **({"tools": env.tool_schemas} if tools else {}),
        "task_id": task.id,
        "habit": habit,
        "reward": result.reward,
    }


async def expert_rows(demo: ZoomDemoConfig) -> list[dict[str, Any]]:
    """The scripted expert's episodes (SFT rows) on the first ``num_traces + num_compact``
    train tasks, the first ``num_traces`` with the tool schema."""
    from agentloop.envs import make

    rng = random.Random(f"deepeyes-traces/{demo.seed}")
    env = make(ENV, **ENV_KWARGS)
    rows = []
    try:
        for i, task in enumerate(env.tasks("train", demo.num_traces + demo.num_compact)):
            u = rng.random()
            habit = (
                "wrong_box"
                if u < demo.wrong_box_rate
                else "guess"
                if u < demo.wrong_box_rate + demo.no_zoom_rate
                else "expert"
            )
            rows.append(await _episode(env, task, habit, rng, tools=i < demo.num_traces))
    finally:
        await env.close()
    return rows


def make_deepeyes_traces(demo: ZoomDemoConfig, path: Path) -> Path:
    """Play the scripted expert through ZoomVQA-v0 into the SFT traces file ``path``."""
    rows = asyncio.run(expert_rows(demo))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    habits = {h: sum(r["habit"] == h for r in rows) for h in ("expert", "wrong_box", "guess")}
    print(f"played {len(rows)} scripted ZoomVQA-v0 grid episodes into {path}: {habits}")
    return path


def _sft_overrides(demo: ZoomDemoConfig) -> tuple[str, ...]:
    return (override("model.path", str(_base_path(demo))),)


def _check(configs: DemoConfigs[ZoomDemoConfig]) -> None:
    data = configs.grpo.data
    given = {k: data.env_kwargs.get(k) for k in ("layout", "reward")}
    if data.env != ENV or given != {"layout": "grid", "reward": "deepeyes"}:
        raise ConfigError(
            f"grpo data.env={data.env!r} with env_kwargs {dict(data.env_kwargs)}: the DeepEyes "
            f"demo's traces are {ENV} grid tasks, so RL must play them too; set data.env={ENV} "
            "and data.env_kwargs {layout: grid, reward: deepeyes}"
        )


DEEPEYES = DemoFamily(
    name="deepeyes",
    title="tiny DeepEyes on ZoomVQA-v0",
    tool="image_zoom_in",
    settings=ZoomDemoConfig,
    base_model=deepeyes_base_dir,
    make_traces=make_deepeyes_traces,
    model_name="tiny-zoom",
    sft_overrides=_sft_overrides,
    check=_check,
)
