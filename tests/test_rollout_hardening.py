"""The loop under hostile tools: no event-loop stall on huge output, failures stay per episode."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.fake import FakeEngine
from agentloop.envs import ToolEnv
from agentloop.rollout import RolloutConfig
from agentloop.tools import runtime as tool_runtime
from agentloop.tools import tool, truncate_to_tokens
from agentloop.types import Message, StopReason, Task, Trajectory

STALL_BOUND_S = 1.0  # today's main: ~12-24 s for 10 MB; after: tens of milliseconds


@tool
def flood(chars: int) -> str:
    """Print a lot.

    Args:
        chars: How many characters.
    """
    return ("word, 12345 éà\n" * (chars // 15 + 1))[:chars]


def no_reward(task: Task, messages: Sequence[Message]) -> float:
    return 0.0


def make_env() -> ToolEnv:
    return ToolEnv([flood], no_reward)


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture(scope="module")
def builder(tokenizer: Any) -> TokenBuilder:
    return TokenBuilder(tokenizer, tools=make_env().tool_schemas)


async def collect_watching_the_loop(
    builder: TokenBuilder, engine: FakeEngine, config: RolloutConfig, env: Any = make_env
) -> tuple[list[Trajectory], float]:
    """Collect one episode while a ticker measures the longest the event loop was blocked."""
    gaps = [0.0]
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    watch = asyncio.create_task(ticker())
    try:
        groups = await collect([Task("t", {"prompt": "q"})], env, engine, builder, config=config)
    finally:
        done.set()
        await watch
    return [t for g in groups for t in g.trajectories], max(gaps)


def tool_message(traj: Trajectory) -> str:
    (msg,) = [m for m in traj.messages if m.role == "tool"]
    return msg.content


async def test_a_10_mb_tool_output_does_not_stall_the_event_loop(
    builder: TokenBuilder, tokenizer: Any
) -> None:
    engine = FakeEngine([call("flood", chars=10_000_000), "done"], tokenizer=tokenizer,
                        eos_token_id=2)  # fmt: skip
    config = RolloutConfig(max_tool_output_tokens=256, max_response_len=4096)
    (traj,), stall = await collect_watching_the_loop(builder, engine, config)
    assert stall < STALL_BOUND_S, f"the event loop was blocked {stall:.2f} s"
    assert traj.stop_reason is StopReason.DONE, traj.error
    content = tool_message(traj)
    assert "characters]…" in content and content.startswith("word, 12345")
    assert len(builder.encode(content)) <= 256


async def test_ordinary_tool_output_is_cut_as_before(builder: TokenBuilder, tokenizer: Any) -> None:
    chars = 40_000  # above the inline bound (cut on a worker thread), within the exact path
    engine = FakeEngine([call("flood", chars=chars), "done"], tokenizer=tokenizer, eos_token_id=2)
    config = RolloutConfig(max_tool_output_tokens=64, max_response_len=4096)
    (traj,), _ = await collect_watching_the_loop(builder, engine, config)
    full = flood.fn(chars=chars)
    assert tool_message(traj) == truncate_to_tokens(full, 64, builder.encode, builder.decode)
    assert "tokens]…" in tool_message(traj)


@tool
async def cancel_myself() -> str:
    """Raises CancelledError though nobody cancelled it."""
    raise asyncio.CancelledError


@tool
async def interrupt_async() -> str:
    """Raises KeyboardInterrupt on the event loop."""
    raise KeyboardInterrupt


@tool
def interrupt_sync() -> str:
    """Raises KeyboardInterrupt on its worker thread."""
    raise KeyboardInterrupt


@tool(timeout_s=0.2)
async def stubborn() -> str:
    """Ignores every cancellation."""
    while True:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)


def nan_reward(task: Task, messages: Sequence[Message]) -> float:
    return float(task.data["reward"])


def hostile_env() -> ToolEnv:
    tools = [flood, cancel_myself, interrupt_async, interrupt_sync, stubborn]
    return ToolEnv(tools, nan_reward)


@pytest.fixture(scope="module")
def hostile_builder(tokenizer: Any) -> TokenBuilder:
    return TokenBuilder(tokenizer, tools=hostile_env().tool_schemas)


def test_tools_raising_cancellation_or_interrupts_fail_only_their_episode(
    hostile_builder: TokenBuilder, tokenizer: Any
) -> None:
    names = ["cancel_myself", "interrupt_async", "interrupt_sync"]

    def script(prompt_ids: Sequence[int], sampling: Any) -> str:
        text = tokenizer.decode(prompt_ids)
        if "<tool_response>" in text:
            return "done"
        name = next((n for n in names if f"use {n}" in text), "flood")
        return call(name) if name != "flood" else call("flood", chars=5)

    tasks = [Task(n, {"prompt": f"use {n}", "reward": 1}) for n in [*names, "fine"]]
    engine = FakeEngine(script, tokenizer=tokenizer, eos_token_id=2)
    groups = asyncio.run(collect(tasks, hostile_env, engine, hostile_builder,
                                 config=RolloutConfig()))  # fmt: skip
    by_task = {g.task.id: g.trajectories[0] for g in groups}
    for name in names:
        traj = by_task[name]
        assert traj.stop_reason is StopReason.TOOL_FATAL, (name, traj.error)
        assert f"tool {name!r} raised" in (traj.error or "")
    assert by_task["fine"].stop_reason is StopReason.DONE and by_task["fine"].reward == 1.0


@pytest.mark.parametrize("reward", ["nan", "inf", "-inf"])
def test_a_non_finite_reward_is_the_episodes_named_failure(
    hostile_builder: TokenBuilder, tokenizer: Any, reward: str
) -> None:
    engine = FakeEngine(["\\boxed{1}"], tokenizer=tokenizer, eos_token_id=2)
    tasks = [Task("t", {"prompt": "q", "reward": reward})]
    (group,) = asyncio.run(collect(tasks, hostile_env, engine, hostile_builder,
                                   config=RolloutConfig()))  # fmt: skip
    (traj,) = group.trajectories
    assert traj.stop_reason is StopReason.ENV_ERROR
    assert f"non-finite reward ({float(reward)})" in (traj.error or "")


def test_a_reward_raising_an_interrupt_or_exit_fails_only_its_episode(
    hostile_builder: TokenBuilder, tokenizer: Any
) -> None:
    def reward(task: Task, messages: Sequence[Message]) -> float:
        if task.id == "interrupt":
            raise KeyboardInterrupt
        if task.id == "exit":
            raise SystemExit(3)
        return 1.0

    def env() -> ToolEnv:
        return ToolEnv([flood], reward)

    engine = FakeEngine(["\\boxed{1}"], tokenizer=tokenizer, eos_token_id=2)
    tasks = [Task(i, {"prompt": "q"}) for i in ("interrupt", "exit", "fine")]
    builder = TokenBuilder(tokenizer, tools=env().tool_schemas)
    groups = asyncio.run(collect(tasks, env, engine, builder, config=RolloutConfig()))
    by_task = {g.task.id: g.trajectories[0] for g in groups}
    for name, raised in (("interrupt", "KeyboardInterrupt"), ("exit", "SystemExit")):
        assert by_task[name].stop_reason is StopReason.ENV_ERROR, by_task[name]
        assert f"the env raised {raised}" in (by_task[name].error or "")
    assert by_task["fine"].stop_reason is StopReason.DONE and by_task["fine"].reward == 1.0


def test_a_tool_that_swallows_cancellation_does_not_hang_shutdown(
    hostile_builder: TokenBuilder, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncio.run cancels and awaits every task at exit: one that never ends would hang it. The
    run goes on a thread so a regression fails here instead of hanging the test session."""
    monkeypatch.setattr(tool_runtime, "STOP_ABANDONED_S", 0.5)
    engine = FakeEngine([call("stubborn"), "done"], tokenizer=tokenizer, eos_token_id=2)
    outcome: list[Trajectory] = []

    def run() -> None:
        groups = asyncio.run(collect([Task("t", {"prompt": "q", "reward": 0})], hostile_env,
                                     engine, hostile_builder, config=RolloutConfig()))  # fmt: skip
        outcome.extend(groups[0].trajectories)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "asyncio.run did not return: a tool's task never ended"
    (traj,) = outcome
    (msg,) = [m for m in traj.messages if m.role == "tool"]
    assert "timed out" in msg.content and traj.stop_reason is StopReason.DONE
