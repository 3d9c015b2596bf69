"""The recipes' envs and rewards: answer extraction, scores, and the LLM judge over real HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agentloop.envs import make
from agentloop.envs.deepeyes import (
    HttpJudge,
    deepeyes_format,
    deepeyes_reward,
    deepeyes_score,
    rule_match,
)
from agentloop.envs.math_tool import extract_math_answer, math_tool_reward
from agentloop.envs.search_r1 import search_r1_reward
from agentloop.errors import RewardError
from agentloop.types import Message, Task, ToolCall


def _reply(text: str, calls: tuple[ToolCall, ...] = ()) -> Message:
    return Message("assistant", text, calls)


async def test_math_answer_is_the_last_box_or_answer_line() -> None:
    assert extract_math_answer("x \\boxed{3} then \\boxed{ 45 }") == "45"
    assert extract_math_answer("work...\nAnswer: $45$") == "45"
    assert extract_math_answer("The answer: 45") is None  # not a line of its own form
    assert extract_math_answer("\\boxed{}") is None
    assert extract_math_answer("\\boxed{" + "1" * 201 + "}") is None
    task = Task("t", {"prompt": "p", "answer": "45"})
    call = ToolCall("code_interpreter", {"code": "print(45)"})
    right = await math_tool_reward(task, [_reply("", (call,)), Message("tool", "45"),
                                          _reply("so \\boxed{45.0}")])  # fmt: skip
    assert right.value == 1.0 and right.metrics["tool_calls"] == 1.0
    assert (await math_tool_reward(task, [_reply("\\boxed{46}")])).value == 0.0
    assert (await math_tool_reward(task, [_reply("45")])).metrics["has_answer"] == 0.0


def test_search_r1_reward_is_exact_match_only() -> None:
    task = Task("q", {"prompt": "who wrote hamlet", "answer": ["William Shakespeare", "Shake"]})
    assert search_r1_reward(task, [_reply("<answer>william shakespeare.</answer>")]).value == 1.0
    assert search_r1_reward(task, [_reply("\\boxed{Shake}")]).value == 1.0
    partial = search_r1_reward(task, [_reply("<answer>Shakespeare the bard</answer>")])
    assert partial.value == 0.0 and 0 < partial.metrics["f1"] < 1
    assert search_r1_reward(task, [_reply("<answer>" + "Shake " * 60 + "</answer>")]).value == 0


@pytest.mark.parametrize(
    ("correct", "format_ok", "zoomed", "score"),
    [(True, True, True, 2.0), (True, True, False, 0.8), (False, True, True, 0.0),
     (False, False, True, -0.2), (True, False, True, 1.8), (False, True, False, 0.0)],
)  # fmt: skip
def test_deepeyes_score_pays_the_tool_bonus_only_when_right(
    correct: bool, format_ok: bool, zoomed: bool, score: float
) -> None:
    assert deepeyes_score(correct=correct, format_ok=format_ok, zoomed=zoomed) == pytest.approx(
        score
    )


def test_deepeyes_format_rules() -> None:
    assert deepeyes_format([_reply("<think>x</think><answer>red</answer>")]) == ("red", True)
    assert deepeyes_format([_reply("<think>x<answer>red</answer>")]) == ("red", False)
    assert deepeyes_format([_reply("<answer>a</answer><answer>b</answer>")]) == ("b", False)
    assert deepeyes_format([_reply("<answer> </answer>")]) == (None, False)
    assert deepeyes_format([_reply("red")]) == (None, False)
    assert deepeyes_format([_reply("z", (ToolCall("image_zoom_in"),))]) == (None, False)
    assert rule_match("B. green", "B") and not rule_match("green", "B")
    assert rule_match("Tan.", "tan") and not rule_match("The countertop is tan", "tan")


class _Judge:
    """An OpenAI-compatible chat server on loopback standing in for the judge engine."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.fail_first = 0

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        if self.fail_first > 0:
            self.fail_first -= 1
            return web.Response(status=503, text="busy")
        if body.get("model") != "judge":
            return web.json_response({"error": "unknown model"}, status=404)
        prompt = body["messages"][-1]["content"]
        gold = prompt.split("Reference answer: ")[1].split("\n")[0]
        said = prompt.split("Model answer: ")[1].split("\n")[0]
        verdict = "1" if gold.split()[-1].strip(".").lower() in said.lower() else "0"
        return web.json_response({"choices": [{"message": {"content": f"Judgement: {verdict}"}}]})


@pytest.fixture
async def judge() -> AsyncIterator[tuple[_Judge, str]]:
    server = _Judge()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", server.chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield server, f"http://127.0.0.1:{port}/v1"
    await runner.cleanup()


async def test_the_llm_judge_decides_accuracy_over_http(judge: tuple[_Judge, str]) -> None:
    server, url = judge
    question, gold = "Is the countertop tan or blue?", "The countertop is tan."
    task = Task("t", {"prompt": question, "answer": gold})
    zoom = [_reply("", (ToolCall("image_zoom_in", {"bbox_2d": [0, 0, 9, 9]}),)),
            Message("tool", "Zoomed.", images=(object(),))]  # fmt: skip
    right = await deepeyes_reward(task, [*zoom, _reply("<answer>tan</answer>")], HttpJudge(url))
    assert right.value == pytest.approx(2.0) and right.metrics["tool_bonus"] == 1.0
    wrong = await deepeyes_reward(task, [*zoom, _reply("<answer>blue</answer>")], HttpJudge(url))
    assert wrong.value == 0.0 and wrong.metrics["tool_bonus"] == 0.0
    assert question in server.bodies[0]["messages"][0]["content"]
    assert server.bodies[0]["temperature"] == 0.0
    server.fail_first = 2  # 5xx is retried
    assert await HttpJudge(url, retries=3)("q", "red", "red") is True
    with pytest.raises(RewardError, match=r"answered 404"):
        await HttpJudge(url, model="other")("q", "red", "red")
    with pytest.raises(RewardError, match=r"failed 2 times .* is it up\?"):
        await HttpJudge("http://127.0.0.1:9/v1", retries=1, timeout_s=2)("q", "a", "a")


async def test_deepeyes_env_uses_the_judge_url(
    judge: tuple[_Judge, str], deepeyes_data: Path
) -> None:
    server, url = judge
    env = make("agentloop/DeepEyes-v0", files={"train": str(deepeyes_data / "train.jsonl")},
               judge_url=url)  # fmt: skip
    task = env.tasks("train")[0]
    messages, _ = await env.reset(options={"task": task})
    assert len(messages[-1].images) == 1
    result = await env.step(_reply(f"<answer>{task.data['answer']}</answer>"))
    await env.close()
    assert result.terminated and result.reward == pytest.approx(0.8)  # right, no zoom
    assert len(server.bodies) == 1
    assert json.dumps(task.data["prompt"])[1:-1] in server.bodies[0]["messages"][0]["content"]


def test_math_env_runs_code_in_the_sandbox(retool_data: Path) -> None:
    env = make("agentloop/MathTool-v0", files={"aime2024": str(retool_data / "aime2024.jsonl")})
    task = env.tasks("aime2024")[0]

    async def episode() -> list[Any]:
        await env.reset(options={"task": task})
        call = ToolCall("code_interpreter", {"code": "x = pow(7, 100, 13)\nprint(x)"}, id="c")
        first = await env.step(_reply("", (call,)))
        last = await env.step(_reply("\\boxed{9}"))
        await env.close()
        return [first, last]

    first, last = asyncio.run(episode())
    assert first.observation[0].content.strip() == "9"
    assert last.terminated and last.reward == 1.0
