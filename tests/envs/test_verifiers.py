"""verifiers' environments, unchanged, through agentloop's env API and ``agentloop eval``.

The environment is ``vf_calc.py`` beside this file, in verifiers' own format, loaded by
verifiers' own loader (``vf.load_environment("vf-calc")``, as ``vf-eval vf-calc`` loads it); its
tool, stop conditions and rubric are the oracle."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentloop.envs import make
from agentloop.errors import EnvError
from agentloop.types import Message, ToolCall

pytest.importorskip("verifiers.legacy.envs.tool_env")
HERE = Path(__file__).resolve().parent
ENV = "verifiers:vf-calc"


@pytest.fixture(autouse=True)
def _env_module_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


def test_a_verifiers_tool_env_plays_with_its_own_tools_stops_and_rubric() -> None:
    """verifiers' ToolEnv answers the call with its tool, stops when a reply calls none (its
    ``no_tools_called``), and its rubric's weighted sum is the reward, each function a metric."""
    import verifiers as vf
    import vf_calc

    env = make(ENV, env_args={"num_examples": 4})
    assert env.env_id == ENV
    assert [t["function"]["name"] for t in env.tool_schemas] == ["python"]
    tasks = env.tasks("test")
    loaded = vf.load_environment("vf-calc", num_examples=4)
    assert len(tasks) == len(loaded.get_eval_dataset()) == 2
    assert [t.id for t in env.tasks("train", 3)] == ["vf-calc-0", "vf-calc-1", "vf-calc-2"]
    task = tasks[1]  # Calc-v0's calc-test-000001, as the env's dataset row
    question = "A crate holds 470 apples. How many apples are in 70 crates and 92 loose apples?"
    assert task.data["question"] == question and task.data["answer"] == "32992"

    async def play() -> list[Any]:
        obs, _ = await env.reset(options={"task": task})
        assert obs == [
            Message("system", vf_calc.SYSTEM_PROMPT),
            Message("user", question),
        ]
        call = ToolCall("python", {"code": "print(470 * 70 + 92)"}, "c1", raw="<tool_call>.")
        steps = [
            await env.step(Message("assistant", "Let me compute. <tool_call>.", (call,))),
            await env.step(Message("assistant", "It is \\boxed{32992}.")),
        ]
        await env.close()
        return steps

    calc, answer = asyncio.run(play())
    assert calc.observation == [Message("tool", "32992\n", tool_call_id="c1", name="python")]
    assert calc.reward == 0.0 and not calc.terminated
    assert answer.terminated and answer.observation == []
    length = vf_calc.reply_length([{"content": "It is \\boxed{32992}."}])
    assert answer.reward == pytest.approx(1.0 + 0.5 * length)
    assert answer.metrics == pytest.approx({
        "verifiers/correct_answer": 1.0, "verifiers/reply_length": length,
        "verifiers/num_turns": 2.0, "verifiers/total_tool_calls": 1.0,
        "verifiers/python_calls": 1.0,
    })  # fmt: skip
    assert answer.info["stop_condition"] == "no_tools_called"


def test_the_envs_own_turn_limit_ends_and_scores_the_rollout() -> None:
    env = make(ENV, env_args={"num_examples": 2, "max_turns": 1})
    call = ToolCall("python", {"code": "print(1)"}, raw="<c>")

    async def play() -> Any:
        await env.reset(options={"task": env.tasks("train")[0]})
        return await env.step(Message("assistant", "<c>", (call,)))

    step = asyncio.run(play())
    assert step.terminated and step.info["stop_condition"] == "max_turns_reached"
    assert step.metrics["verifiers/python_calls"] == 1.0 and step.reward == 0.0


def test_bad_verifiers_ids_splits_and_arguments_are_named() -> None:
    with pytest.raises(EnvError, match=r"could not import its module 'vf_calk'.*PYTHONPATH"):
        make("verifiers:vf-calk")
    with pytest.raises(EnvError, match=r"refused env_args \['num_exampels'\].*'num_examples'"):
        make(ENV, env_args={"num_exampels": 2})
    with pytest.raises(EnvError, match=r"'env_arg'.*Did you mean 'env_args'"):
        make(ENV, env_arg={})
    with pytest.raises(EnvError, match=r"no split 'tset'\. Did you mean 'test'"):
        make(ENV).tasks("tset")


def visible(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant reply as verifiers sees it: the text around its parsed calls."""
    text = message["content"]
    for call in message.get("tool_calls") or []:
        text = text.replace(call["raw"], "", 1)
    return {"content": text.strip() or None}


@pytest.mark.slow  # the HF engine plays 2 episodes of up to 3 turns
def test_agentloop_eval_plays_a_verifiers_env(calc_caller_dir: Path, tmp_path: Path) -> None:
    """The tiny tool caller plays the ToolEnv: its calls run the env's tool, and every reward
    and metric is the rubric's own score of the replies as verifiers saw them."""
    import vf_calc
    from transformers import AutoTokenizer

    from agentloop.cli import main
    from agentloop.io import read_jsonl

    out = tmp_path / "run"
    args = ["eval", "--env", ENV, "--env-arg", 'env_args={"num_examples": 4}',
            "--model", str(calc_caller_dir), "--out", str(out), "--engine", "hf", "--quiet",
            "--n", "1", "--max-turns", "3", "--max-response-len", "200"]  # fmt: skip
    assert main(args) == 0
    records = read_jsonl(out / "trajectories.jsonl")
    answers = {
        t.id: t.data["answer"] for t in make(ENV, env_args={"num_examples": 4}).tasks("test")
    }
    assert sorted(r["task_id"] for r in records) == sorted(answers) == ["vf-calc-0", "vf-calc-1"]
    decode = AutoTokenizer.from_pretrained(calc_caller_dir).decode
    for r in records:
        assert r["error"] is None, r["error"]
        assert '"python"' in decode(r["token_ids"][: r["prompt_len"]])  # the env's tool, shown
        replies = [m for m in r["messages"] if m["role"] == "assistant"]
        last = visible(replies[-1])
        correct = vf_calc.correct_answer([last], answers[r["task_id"]])
        length = vf_calc.reply_length([last])
        calls = sum(len(m.get("tool_calls") or []) for m in replies)
        assert r["metrics"] == pytest.approx({**r["metrics"],
            "verifiers/correct_answer": correct, "verifiers/reply_length": length,
            "verifiers/num_turns": len(replies), "verifiers/total_tool_calls": calls,
            "verifiers/python_calls": calls})  # fmt: skip
        assert r["reward"] == pytest.approx(correct + 0.5 * length)
        assert [t["reward"] for t in r["turns"]][:-1] == [0.0] * (len(r["turns"]) - 1)
        assert sum(r["loss_mask"]) == sum(t["completion_tokens"] for t in r["turns"])
    tool_turns = [m for r in records for m in r["messages"] if m["role"] == "tool"]
    assert tool_turns and all(m["name"] == "python" for m in tool_turns)  # the env's tool answered


#: Environments that agentloop must refuse, or whose failures it must record, named: written as
#: a verifiers user would, one module, ``load_environment(kind)``.
ODD_ENVS = """
import verifiers as vf
from datasets import Dataset


class Echo(vf.MultiTurnEnv):
    def __init__(self, rewrite, **kwargs):
        super().__init__(max_turns=3, **kwargs)
        self.rewrite = rewrite

    async def env_response(self, messages, state, **kwargs):
        if self.rewrite is None:
            raise vf.ToolCallError("the echo service is down")
        return [{"role": "user", "content": "again"}]

    async def get_prompt_messages(self, state):
        messages = await super().get_prompt_messages(state)
        return messages[-1:] if self.rewrite and state["trajectory"] else messages


def load_environment(kind="error"):
    rows = Dataset.from_list([{"question": "Say hi.", "answer": "hi"}])
    def said(completion, answer):
        return float(answer in (completion[-1]["content"] or ""))
    def best_of_group(completions):
        return [0.0] * len(completions)
    funcs = [said, best_of_group] if kind == "group" else [said]
    rubric = vf.Rubric(funcs=funcs)
    if kind == "single":
        return vf.SingleTurnEnv(dataset=rows, rubric=rubric)
    return Echo({"error": None, "rewrite": True, "group": False}[kind], dataset=rows, rubric=rubric)
"""


@pytest.fixture
def odd_envs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "vf_odd.py").write_text(ODD_ENVS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "verifiers:vf-odd"


def play_turns(env_id: str, kind: str, replies: list[str]) -> list[Any]:
    env = make(env_id, env_args={"kind": kind})

    async def play() -> list[Any]:
        await env.reset(options={"task": env.tasks("train")[0]})
        try:
            return [await env.step(Message("assistant", text)) for text in replies]
        finally:
            await env.close()

    return asyncio.run(play())


def test_a_single_turn_env_ends_after_one_reply_scored_by_its_rubric(odd_envs: str) -> None:
    (step,) = play_turns(odd_envs, "single", ["hi there"])
    assert step.terminated and step.reward == 1.0 and step.metrics["verifiers/said"] == 1.0
    assert step.info["stop_condition"] == "max_turns_reached"


def test_env_failures_and_what_agentloop_cannot_play_are_named(odd_envs: str) -> None:
    """A vf.Error in the env's response fails the rollout (agentloop records it as the
    episode's error); a prompt that rewrites the conversation, and group reward functions,
    are refused."""
    with pytest.raises(EnvError, match="failed the rollout: ToolCallError: the echo service"):
        play_turns(odd_envs, "error", ["hi"])
    with pytest.raises(EnvError, match="rewrites the conversation"):
        play_turns(odd_envs, "rewrite", ["hi"])
    with pytest.raises(EnvError, match="group reward functions"):
        make(odd_envs, env_args={"kind": "group"})
