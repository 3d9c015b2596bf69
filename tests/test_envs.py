"""Env API: gymnasium compatibility, the registry, and the Calc reference env."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentloop.envs as envs
from agentloop.envs import CalcEnv, calc_reward, extract_boxed, make_calc_task, math_equal
from agentloop.errors import EnvError
from agentloop.types import Message, Task, ToolCall


def test_check_env_passes_for_calc() -> None:
    env = gymnasium.make("agentloop/Calc-v0")
    check_env(env.unwrapped)
    env.close()


def test_gymnasium_episode_with_a_tool_call() -> None:
    env = gymnasium.make("agentloop/Calc-v0", sandbox="fake")
    obs, info = env.reset(seed=3)
    task = make_calc_task("train", 3)
    assert task.data["prompt"] in obs and info["task_id"] == task.id
    obs, reward, terminated, truncated, _ = env.step(
        '<tool_call>\n{"name": "python", "arguments": {"code": "print(2 * 21)"}}\n</tool_call>'
    )
    assert "42" in obs and not terminated and reward == 0.0
    obs, reward, terminated, truncated, _ = env.step(f"\\boxed{{{task.data['answer']}}}")
    assert terminated and not truncated and reward == 1.0
    env.close()


def test_registry_did_you_mean() -> None:
    with pytest.raises(EnvError, match="Did you mean 'agentloop/Calc-v0'"):
        envs.make("agentloop/Calc-v1")
    with pytest.raises(EnvError, match="namespace/Name-v0"):
        envs.register("calc", CalcEnv)
    with pytest.raises(EnvError, match="already registered"):
        envs.register("agentloop/Calc-v0", CalcEnv)
    assert "agentloop/Calc-v0" in envs.registered()


def test_make_passes_kwargs_and_names_bad_ones() -> None:
    assert envs.make("agentloop/Calc-v0", digits=4).digits == 4  # type: ignore[attr-defined]
    with pytest.raises(EnvError, match=r"bad arguments.*Valid arguments: \['digits', 'max_turns'"):
        envs.make("agentloop/Calc-v0", colour="red")
    with pytest.raises(EnvError, match=r"'digit'.*Did you mean 'digits'\? Valid arguments"):
        envs.make("agentloop/Calc-v0", digit=2)


def test_module_colon_id_imports_the_module_that_registers_the_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_calc_envs.py").write_text(
        "from agentloop.envs import CalcEnv, register\n"
        "register('me/MyCalc-v0', CalcEnv, kwargs={'digits': 3})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = envs.make("my_calc_envs:me/MyCalc-v0")
    assert (env.env_id, env.digits) == ("me/MyCalc-v0", 3)  # type: ignore[attr-defined]
    with pytest.raises(EnvError, match=r"cannot import module 'no_such_mod'.*PYTHONPATH"):
        envs.make("no_such_mod:me/MyCalc-v0")


def test_calc_tasks_are_deterministic_and_splits_differ() -> None:
    env = CalcEnv()
    assert env.tasks("test", 50) == CalcEnv().tasks("test", 50)
    train = {t.data["prompt"] for t in env.tasks("train", 500)}
    test = {t.data["prompt"] for t in env.tasks("test", 500)}
    assert len(train & test) < 5
    with pytest.raises(EnvError, match="split 'dev'"):
        env.tasks("dev", 1)


async def test_calc_verifier_accepts_gold_and_rejects_wrong() -> None:
    for task in CalcEnv(digits=4).tasks("test", 200):
        gold = task.data["answer"]
        good = [Message("user", "q"), Message("assistant", f"So \\boxed{{{gold}}}.")]
        bad = [Message("user", "q"), Message("assistant", f"\\boxed{{{int(gold) + 1}}}")]
        right, wrong = await calc_reward(task, good), await calc_reward(task, bad)
        assert right.value == 1.0 and wrong.value == 0.0
        assert right.verdict is not None and right.verdict.by == "numeric"  # no verifier call
        assert wrong.verdict is not None and wrong.verdict.by == "numeric"
    empty = await calc_reward(Task("x", {"answer": "3"}), [Message("assistant", "\\boxed{}")])
    assert empty.value == 0.0 and empty.metrics["has_boxed"] == 1.0


def test_math_verifier_forms() -> None:
    assert extract_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_boxed("no box") is None and extract_boxed("\\boxed{open") is None
    assert math_equal("1,234", "1234") and math_equal("1234.0", 1234)
    assert math_equal("\\frac{1}{2}", "0.5") and math_equal("$-3$", "-3")
    assert not math_equal("12", "13") and not math_equal(None, "1")


def test_tool_env_contract_errors() -> None:
    async def go() -> None:
        env = CalcEnv()
        with pytest.raises(EnvError, match="before reset"):
            await env.step(Message("assistant", "x"))
        with pytest.raises(EnvError, match="must be an agentloop Task"):
            await env.reset(options={"task": {"prompt": "q"}})
        with pytest.raises(EnvError, match="no 'prompt' field"):
            await env.reset(options={"task": Task("t", {"question": "q"})})
        await env.close()
        await env.close()  # idempotent

    asyncio.run(go())


def test_step_runs_parsed_tool_calls() -> None:
    async def go() -> None:
        env = CalcEnv(sandbox="fake")
        await env.reset(seed=0)
        code = {"code": "x = 6 * 7\nprint(x)"}
        action = Message("assistant", "...", (ToolCall("python", code, id="c0"),))
        result = await env.step(action)
        assert [m.content for m in result.observation] == ["42"]
        assert result.observation[0].tool_call_id == "c0"
        state = Message("assistant", "", (ToolCall("python", {"code": "print(x + 1)"}, id="c1"),))
        assert (await env.step(state)).observation[0].content == "43"  # one session per episode
        await env.close()

    asyncio.run(go())


def test_step_result_carries_tool_results_and_metrics_as_fields() -> None:
    async def go() -> None:
        env = CalcEnv(sandbox="fake")
        task = make_calc_task("test", 0)
        await env.reset(options={"task": task})
        call = ToolCall("python", {"code": "print(1)"}, id="c0")
        result = await env.step(Message("assistant", "", (call,)))
        assert [r.call.id for r in result.tool_results] == ["c0"] and result.metrics == {}
        final = await env.step(Message("assistant", f"\\boxed{{{task.data['answer']}}}"))
        assert final.tool_results == () and final.reward == 1.0 and final.metrics["used_tool"] == 1
        obs, reward, terminated, truncated, info = final  # gymnasium's 5-tuple still unpacks
        assert (obs, reward, terminated, truncated, info) == ([], 1.0, True, False, {})
        await env.close()

    asyncio.run(go())


def test_gymnasium_make_in_a_fresh_interpreter_with_the_module_prefix() -> None:
    """gymnasium >= 1.0 has no plugin entry points: an id needs its registering module imported
    first, which gymnasium's own ``"module:id"`` form does (README documents both ways)."""
    code = (
        "import gymnasium\n"
        "from gymnasium.utils.env_checker import check_env\n"
        "check_env(gymnasium.make('agentloop.envs:agentloop/Calc-v0').unwrapped)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
