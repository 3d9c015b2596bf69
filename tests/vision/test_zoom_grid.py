"""ZoomVQA-v0's grid layout and DeepEyes reward: the DeepEyes demo's tasks, through the env."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from agentloop.envs import make
from agentloop.envs.zoom_grid import GRID_PATTERNS, PANEL_BOXES, pattern_at
from agentloop.envs.zoom_vqa import make_zoom_task, render_zoom_image
from agentloop.errors import EnvError
from agentloop.eval_report import is_success
from agentloop.types import Message, StopReason, Task, ToolCall, Trajectory

KWARGS = {"layout": "grid", "reward": "deepeyes", "max_turns": 3}


def test_grid_tasks_name_a_cell_and_its_panel_box() -> None:
    tasks = make("agentloop/ZoomVQA-v0", **KWARGS).tasks("test", limit=200)
    assert {tuple(t.data["cell"]) for t in tasks} == set(PANEL_BOXES)
    assert {t.data["answer"] for t in tasks} == set(GRID_PATTERNS)
    for t in tasks:
        row, col = t.data["cell"]
        assert f"row {row}, column {col}" in t.data["prompt"]
        assert t.data["answer"] == pattern_at(t, (row, col))
        assert t.data["target_bbox"] == PANEL_BOXES[(row, col)]
        assert all(v % 28 == 0 for v in t.data["target_bbox"])  # whole merged patches
    assert make_zoom_task("test", 5, "grid") == tasks[5] != make_zoom_task("train", 5, "grid")
    image = render_zoom_image(tasks[0])
    assert image.size == (1008, 1008)
    assert np.array_equal(np.asarray(image), np.asarray(render_zoom_image(tasks[0])))
    with pytest.raises(EnvError, match="layout 'rows' is unknown"):
        make_zoom_task("test", 0, "rows")
    with pytest.raises(EnvError, match=r"reward='f1'"):
        make("agentloop/ZoomVQA-v0", reward="f1")


def _pixels(image: Any) -> np.ndarray:
    """What the demo's VLM sees of ``image``: its processor's pixel values (36-token budget)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    processor = Qwen2VLImageProcessorPil(min_pixels=4 * 28 * 28, max_pixels=36 * 28 * 28)
    return np.asarray(processor(images=[image], return_tensors="np")["pixel_values"])


def test_the_pattern_is_invisible_at_the_overview_and_plain_in_a_zoom() -> None:
    """Two tasks whose panels hold different patterns: the overviews the model sees are the
    same to a grey level, their zooms on the panel differ on most pixels, and a zoom shows
    the same pixels for the same pattern wherever its panel is."""
    tasks = make("agentloop/ZoomVQA-v0", **KWARGS).tasks("train", limit=200)
    a = next(t for t in tasks if len(set(t.data["patterns"])) == 4)
    b = next(t for t in tasks if all(map(str.__ne__, t.data["patterns"], a.data["patterns"])))
    overview_a, overview_b = _pixels(render_zoom_image(a)), _pixels(render_zoom_image(b))
    assert overview_a.shape == (144, 1176)  # 36 merged tokens
    gap = np.abs(overview_a - overview_b)  # normalized units: 0.15 is ~10 of 255 grey levels
    assert gap.max() < 0.15 and gap.mean() < 0.002  # a few levels, on the panels' edges only
    crops = {
        pattern_at(t, c): _pixels(render_zoom_image(t).crop(PANEL_BOXES[c]))
        for t in (a, b)
        for c in PANEL_BOXES
    }
    assert len(crops) == 4 and all(c.shape == (64, 1176) for c in crops.values())
    for cell in PANEL_BOXES:  # pattern for pattern, either task, any cell: one crop
        assert np.array_equal(_pixels(render_zoom_image(a).crop(PANEL_BOXES[cell])),
                              crops[pattern_at(a, cell)])  # fmt: skip
    names = sorted(crops)
    for i, x in enumerate(names):
        for y in names[i + 1 :]:
            assert (np.abs(crops[x] - crops[y]) > 1.0).mean() > 0.3, (x, y)


def test_check_env_passes_for_the_grid_layout() -> None:
    env = gymnasium.make("agentloop/ZoomVQA-v0", **KWARGS)
    check_env(env.unwrapped)
    env.close()


async def _play(task: Task, box: list[int] | None, answer: str) -> tuple[float, dict, Any]:
    env = make("agentloop/ZoomVQA-v0", **KWARGS)
    await env.reset(options={"task": task})
    if box is not None:
        call = ToolCall("image_zoom_in", {"bbox_2d": box}, id="z")
        await env.step(Message("assistant", "<tool_call>…</tool_call>", (call,)))
    result = await env.step(Message("assistant", f"\\boxed{{{answer}}}"))
    await env.close()
    assert result.terminated
    return result.reward, dict(result.metrics), result.verdict


async def test_deepeyes_reward_pays_the_tool_bonus_only_with_the_right_pattern() -> None:
    task = make_zoom_task("test", 3, "grid")
    cell, gold = tuple(task.data["cell"]), task.data["answer"]
    other = next(c for c in PANEL_BOXES if pattern_at(task, c) != gold)
    wrong = next(x for x in GRID_PATTERNS if x != gold)
    reward, metrics, verdict = await _play(task, PANEL_BOXES[cell], gold.upper())
    assert reward == pytest.approx(2.0) and metrics["used_tool"] == metrics["zoom_on_target"] == 1
    assert verdict.correct
    reward, metrics, _ = await _play(task, PANEL_BOXES[other], wrong)
    assert reward == 0.0 and metrics["used_tool"] == 1 and metrics["zoom_on_target"] == 0
    reward, metrics, verdict = await _play(task, None, gold)  # right, unzoomed: no bonus
    assert reward == pytest.approx(0.8) and metrics["used_tool"] == 0 and verdict.correct
    reward, _, _ = await _play(task, None, "")  # no answer: a format error
    assert reward == pytest.approx(-0.2)


def test_a_success_is_the_verdict_of_the_answer_where_the_env_gives_one() -> None:
    """pass@k of DeepEyes' reward: a right answer without the tool (0.8) is a success, a wrong
    one is not, whatever the reward; an explicit threshold still reads the reward."""
    from agentloop.types import Verdict

    def traj(reward: float, correct: bool | None) -> Trajectory:
        verdict = (
            None if correct is None else Verdict("K", "K" if correct else "L", correct, "r", "")
        )
        return Trajectory(
            task_id="t", token_ids=(1, 2), loss_mask=(0, 1), logprobs=(0.0, -1.0), prompt_len=1,
            reward=reward, stop_reason=StopReason.DONE, verdict=verdict,
        )  # fmt: skip

    assert is_success(traj(0.8, True)) and not is_success(traj(1.2, False))
    assert is_success(traj(1.0, None)) and not is_success(traj(0.8, None))
    assert not is_success(traj(0.8, True), 1.0) and is_success(traj(2.0, True), 1.0)
