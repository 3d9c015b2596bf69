"""aviary's environments, unchanged, through agentloop's env API and ``agentloop eval``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agentloop.envs import make
from agentloop.errors import EnvError
from agentloop.types import Message, ToolCall

pytest.importorskip("aviary.envs.gsm8k")


def calculator_rows(path: Path, n: int = 3) -> Path:
    """Tasks for aviary-gsm8k's CalculatorEnv: its constructor's arguments, one row each."""
    rows = [
        {
            "id": f"sum-{i}",
            "problem_id": f"sum-{i}",
            "problem": f"What is {i} + {i}?",
            "answer": 2 * i,
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_aviary_calculator_plays_through_its_own_tools_and_reward(tmp_path: Path) -> None:
    """aviary's CalculatorEnv is the oracle: its calculator tool answers the call, a plain reply
    gets aviary's own nudge, and submit_answer scores and ends the episode."""
    from aviary.envs.gsm8k.env import CalculatorEnvConfig

    data = calculator_rows(tmp_path / "test.jsonl")
    env = make("aviary:calculator", files={"test": str(data)})
    assert env.env_id == "aviary:calculator"
    assert [t["function"]["name"] for t in env.tool_schemas] == ["calculator", "submit_answer"]
    task = env.tasks("test")[2]

    async def play() -> list[Any]:
        obs, _ = await env.reset(options={"task": task})
        assert obs == [Message("user", "What is 2 + 2?")]
        calc = ToolCall("calculator", {"expr": "2*2"}, "c1")
        submit = ToolCall("submit_answer", {"answer": "4"})
        steps = [
            await env.step(Message("assistant", "c", (calc,))),
            await env.step(Message("assistant", "I think it is 4.")),
            await env.step(Message("assistant", "s", (submit,))),
        ]
        await env.close()
        return steps

    calc, plain, submit = asyncio.run(play())
    assert calc.observation == [Message("tool", "4", tool_call_id="c1", name="calculator")]
    assert calc.reward == 0.0 and not calc.terminated
    assert plain.observation[0].role == "user" and "No tool calls" in plain.observation[0].content
    assert submit.terminated and submit.reward == CalculatorEnvConfig().correct_reward == 1.0


def test_bad_aviary_ids_and_tasks_are_named(tmp_path: Path) -> None:
    with pytest.raises(EnvError, match=r"no env 'calculater'\. Did you mean 'calculator'"):
        make("aviary:calculater")
    with pytest.raises(EnvError, match="reads its tasks from files"):
        make("aviary:calculator").tasks("test")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "question": "1+1"}) + "\n")
    env = make("aviary:calculator", files={"test": str(bad)})
    with pytest.raises(
        EnvError, match=r"aviary:calculator refused task 'x'.*constructor arguments"
    ):
        asyncio.run(env.reset(options={"task": env.tasks("test")[0]}))


@pytest.mark.slow  # the HF engine plays 2 episodes
def test_agentloop_eval_plays_an_aviary_env(calc_caller_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from agentloop.cli import main
    from agentloop.io import read_jsonl

    data = calculator_rows(tmp_path / "test.jsonl", 2)
    out = tmp_path / "run"
    args = ["eval", "--env", "aviary:calculator", "--env-arg", f'files={{"test": "{data}"}}',
            "--model", str(calc_caller_dir), "--out", str(out), "--engine", "hf", "--quiet",
            "--n", "1", "--max-turns", "2", "--max-response-len", "160"]  # fmt: skip
    assert main(args) == 0
    records = read_jsonl(out / "trajectories.jsonl")
    assert sorted(r["task_id"] for r in records) == ["sum-0", "sum-1"]
    for r in records:
        assert r["error"] is None
        # the prompt showed aviary's tools; whatever the model said, aviary answered it
        prompt = AutoTokenizer.from_pretrained(calc_caller_dir).decode(
            r["token_ids"][: r["prompt_len"]]
        )
        assert '"submit_answer"' in prompt and '"calculator"' in prompt
        assert r["messages"][2]["role"] in ("user", "tool")
        assert r["reward"] == pytest.approx(sum(t["reward"] for t in r["turns"]))
    assert max(len(r["turns"]) for r in records) == 2  # aviary's reply started a second turn
