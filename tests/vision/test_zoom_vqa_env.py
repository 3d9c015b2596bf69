"""ZoomVQA-v0: gymnasium conformance, gold answers, deterministic images, an episode with a zoom."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from agentloop.envs import make
from agentloop.envs.zoom_vqa import make_zoom_task, render_zoom_image, zoom_reward
from agentloop.errors import EnvError
from agentloop.types import Message, ToolCall


def test_check_env_passes_for_zoom_vqa() -> None:
    env = gymnasium.make("agentloop/ZoomVQA-v0")
    check_env(env.unwrapped)
    env.close()


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_verifier_accepts_its_gold_answer_and_rejects_a_wrong_one(split: str) -> None:
    tasks = make("agentloop/ZoomVQA-v0").tasks(split, limit=300)
    assert {t.data["kind"] for t in tasks} == {"code", "dots"}
    for task in tasks:
        gold = task.data["answer"]
        right = zoom_reward(task, [Message("assistant", f"It says \\boxed{{{gold.lower()}}}.")])
        assert right.value == 1.0 and right.metrics["has_boxed"] == 1.0
        wrong_answer = "8" if task.data["kind"] == "dots" else gold[::-1] + "Q"
        assert zoom_reward(task, [Message("assistant", f"\\boxed{{{wrong_answer}}}")]).value == 0
        assert zoom_reward(task, [Message("assistant", gold)]).value == 0  # not boxed


def test_tasks_and_images_are_deterministic_and_the_detail_is_small() -> None:
    a, b = make_zoom_task("test", 7), make_zoom_task("test", 7)
    assert a == b and a != make_zoom_task("train", 7)
    image = render_zoom_image(a)
    assert image.size == (1024, 768)
    assert np.array_equal(np.asarray(image), np.asarray(render_zoom_image(b)))
    x1, y1, x2, y2 = a.data["target_bbox"]
    assert (x2 - x1) * (y2 - y1) < image.size[0] * image.size[1] / 200  # a detail, not a region
    with pytest.raises(EnvError, match="split 'dev'"):
        make_zoom_task("dev", 0)


async def test_an_episode_with_a_zoom_on_the_target() -> None:
    env = make("agentloop/ZoomVQA-v0")
    task = make_zoom_task("train", 3)
    messages, _ = await env.reset(options={"task": task})
    assert len(messages[-1].images) == 1 and messages[-1].images[0].size == (1024, 768)
    x1, y1, x2, y2 = task.data["target_bbox"]
    box = [x1 - 4, y1 - 4, x2 + 4, y2 + 4]
    call = ToolCall("image_zoom_in", {"bbox_2d": box}, id="z1")
    result = await env.step(Message("assistant", "<tool_call>…</tool_call>", (call,)))
    (obs,) = result.observation
    assert obs.role == "tool" and not result.terminated
    crop = np.asarray(render_zoom_image(task))[box[1] : box[3], box[0] : box[2]]
    np.testing.assert_array_equal(np.asarray(obs.images[0]), crop)
    final = await env.step(Message("assistant", f"\\boxed{{{task.data['answer']}}}"))
    assert final.terminated and final.reward == 1.0
    assert final.metrics["zoom_on_target"] == 1.0
    assert final.metrics["zoom_calls"] == 1.0
    await env.close()
