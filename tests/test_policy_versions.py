"""Per-token policy versions: recorded by the rollout loop, kept by io, and kept exact by the
engine's WeightGate (requests vs weight updates). Real-engine partial rollouts:
tests/engines/test_vllm_partial.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.fake import FakeEngine
from agentloop.engines.gate import WeightGate
from agentloop.envs import ToolEnv
from agentloop.errors import InferenceError, TrajectoryError
from agentloop.io import trajectory_from_dict, trajectory_to_dict
from agentloop.rollout import RolloutConfig
from agentloop.tools import tool
from agentloop.types import Completion, Message, StopReason, Task, Trajectory


@tool
def echo(text: str) -> str:
    """Echo the text back.

    Args:
        text: What to echo.
    """
    return text


def _reward(task: Task, messages: Sequence[Message]) -> float:
    return 1.0


def _env() -> ToolEnv:
    return ToolEnv([echo], _reward)


def _call(text: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'echo', 'arguments': {'text': text}})}\n</tool_call>"


def test_records_check_the_number_of_versions() -> None:
    with pytest.raises(TrajectoryError, match="one version per sampled token"):
        Completion((1, 2), (0.0, 0.0), "stop", versions=(0,))
    with pytest.raises(TrajectoryError, match="policy versions for 3 tokens"):
        Trajectory("t", (1, 2, 3), (0, 1, 1), (0.0,) * 3, 1, 0.0, StopReason.DONE, versions=(0,))
    t = Trajectory("t", (1, 2, 3), (0, 1, 1), (0.0,) * 3, 1, 0.0, StopReason.DONE,
                   versions=(-1, 4, 5))  # fmt: skip
    assert t.trained_versions == (4, 5)
    assert trajectory_from_dict(trajectory_to_dict(t)).versions == (-1, 4, 5)
    plain = Trajectory("t", (1, 2), (0, 1), (0.0, 0.0), 1, 0.0, StopReason.DONE)
    assert "versions" not in trajectory_to_dict(plain)
    assert trajectory_from_dict(trajectory_to_dict(plain)).trained_versions == ()


def test_the_rollout_loop_tags_every_token_with_the_version_that_sampled_it(
    tokenizer: Any,
) -> None:
    builder = TokenBuilder(tokenizer, tools=_env().tool_schemas)
    engine = FakeEngine([_call("hi"), "\\boxed{1}"], tokenizer=tokenizer, eos_token_id=2, version=7)
    real = engine.generate

    async def bump_between_turns(*args: Any, **kwargs: Any) -> Completion:
        out = await real(*args, **kwargs)
        engine.version = 8  # a weight update lands between the two turns
        return out

    engine.generate = bump_between_turns  # type: ignore[method-assign]
    task = Task("t0", {"prompt": "say hi"})
    groups = asyncio.run(collect([task], _env, engine, builder, config=RolloutConfig()))
    traj = groups[0].trajectories[0]
    assert len(traj.turns) == 2 and len(traj.versions) == len(traj.token_ids)
    first, second = traj.turns
    assert traj.versions[: traj.prompt_len] == (-1,) * traj.prompt_len
    assert set(traj.versions[first.start : first.start + first.completion_tokens]) == {7}
    assert set(traj.versions[first.start + first.completion_tokens : second.start]) == {-1}
    assert set(traj.versions[second.start :]) == {8}
    assert all((v >= 0) == bool(m) for v, m in zip(traj.versions, traj.loss_mask, strict=True))


def test_an_engine_without_versions_gives_none(tokenizer: Any) -> None:
    builder = TokenBuilder(tokenizer, tools=_env().tool_schemas)
    engine = FakeEngine(["\\boxed{1}"], tokenizer=tokenizer, eos_token_id=2)
    groups = asyncio.run(collect([Task("t0", {"prompt": "q"})], _env, engine, builder,
                                 config=RolloutConfig()))  # fmt: skip
    assert groups[0].trajectories[0].versions == ()


async def test_a_draining_update_waits_for_running_requests() -> None:
    gate, order = WeightGate(timeout_s=5), []
    version, epoch = await gate.admit()

    async def request() -> None:
        await asyncio.sleep(0.1)
        order.append("request done")
        gate.finished()

    async def update() -> None:
        async with gate.update() as interrupted:
            order.append(f"weights loaded (interrupted={interrupted})")
            gate.version = 1

    await asyncio.gather(request(), update())
    assert order == ["request done", "weights loaded (interrupted=False)"]
    assert (version, epoch) == (0, 0) and await gate.admit() == (1, 0)


async def test_an_interrupting_update_aborts_until_every_admitted_request_returned() -> None:
    gate = WeightGate(timeout_s=5)
    await gate.admit()
    _, epoch = await gate.admit()
    aborts = []

    async def abort() -> None:  # the second request reaches the engine only after one retry
        aborts.append(gate.running)
        if len(aborts) <= 2:
            gate.finished()

    admitted_during: list[tuple[int, int]] = []

    async def late_request() -> None:
        await asyncio.sleep(0.01)
        admitted_during.append(await gate.admit())  # waits until the update is over

    async def update() -> None:
        async with gate.update(abort) as interrupted:
            assert interrupted and gate.running == 0
            gate.version = 3

    await asyncio.gather(update(), late_request())
    assert aborts == [2, 1] and gate.interrupted(epoch)
    assert admitted_during == [(3, 1)]


async def test_gate_waits_have_deadlines() -> None:
    gate = WeightGate(timeout_s=0.2)
    await gate.admit()
    with pytest.raises(InferenceError, match="interrupt them instead"):
        async with gate.update():
            pass
    gate.finished()

    async def slow_update() -> None:
        async with gate.update():
            await asyncio.sleep(1.0)

    task = asyncio.create_task(slow_update())
    await asyncio.sleep(0.05)
    with pytest.raises(InferenceError, match="held new requests back"):
        await gate.admit()
    task.cancel()
