"""AgentEnv's own limits through ``collect``: a deadline ends a sleeping agent (no hang), the
token ceiling holds against an agent that keeps asking, and an agent that raises is that
episode's env error while its siblings finish."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import openai

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.base import SamplingParams
from agentloop.engines.fake import FakeEngine
from agentloop.envs import AgentProgram, Env
from agentloop.rollout import RolloutConfig
from agentloop.testing.calc_agent import calc_agent
from agentloop.types import StopReason, Task, Trajectory

CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(2 * 3 + 1)"}}\n</tool_call>'
TASKS = [Task("ok", {"prompt": "What is 2 * 3 + 1?", "answer": "7"}),
         Task("odd", {"prompt": "What is 2 * 3 + 1 now?", "answer": "7"})]  # fmt: skip


def _engine(tokenizer: Any) -> FakeEngine:
    def script(prompt_ids: list[int], sampling: SamplingParams) -> str:
        return (
            "The answer is \\boxed{7}."
            if "<tool_response>" in tokenizer.decode(prompt_ids)
            else CALL
        )

    return FakeEngine(script, tokenizer=tokenizer,
                      eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))  # fmt: skip


async def _play(tokenizer: Any, agent: Any, **env_kwargs: Any) -> dict[str, list[Trajectory]]:
    groups = await collect(
        TASKS, "agentloop/Agent-v0", _engine(tokenizer), TokenBuilder(tokenizer),
        config=RolloutConfig(max_turns=4), group_size=2,
        env_kwargs={"agent": agent, **env_kwargs},
    )  # fmt: skip
    return {g.task.id: list(g.trajectories) for g in groups}


def _assert_fine(trajs: list[Trajectory]) -> None:
    assert len(trajs) == 2, trajs
    for t in trajs:
        assert not t.failed and t.reward == 1.0 and t.stop_reason is StopReason.DONE, t.error


async def test_an_agent_past_its_deadline_ends_with_timeout_not_a_hang(tokenizer: Any) -> None:
    async def sleepy(task: Task, client: Any) -> str:
        if task.id == "odd":
            await client.chat.completions.create(
                model="agentloop", messages=[{"role": "user", "content": "hi"}]
            )
            await asyncio.sleep(3600)  # far past timeout_s
        return await calc_agent(task, client)

    t0 = time.monotonic()
    played = await _play(tokenizer, sleepy, timeout_s=1.0)
    assert time.monotonic() - t0 < 30
    _assert_fine(played["ok"])
    for t in played["odd"]:
        assert t.stop_reason is StopReason.TIMEOUT and t.failed
        assert t.error is not None and "timeout_s=1.0" in t.error
        assert t.num_trained_tokens > 0  # the request before the sleep is recorded


async def test_max_tokens_is_a_ceiling_the_agent_cannot_lift(tokenizer: Any) -> None:
    """The agent asks for more after every reply, with a large max_tokens; the episode's
    tokens after the first prompt stay within AgentEnv's max_tokens and the refusal is the
    episode's MAX_TOKENS stop."""
    refused: list[openai.BadRequestError] = []

    async def greedy(task: Task, client: Any) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": str(task.data["prompt"])}]
        while True:
            try:
                reply = await client.chat.completions.create(
                    model="agentloop", messages=messages, max_tokens=4096
                )
            except openai.BadRequestError as exc:
                refused.append(exc)
                raise
            messages += [reply.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": "more"}]  # fmt: skip

    played = await _play(tokenizer, greedy, max_tokens=24)
    trajs = [t for ts in played.values() for t in ts]
    assert len(trajs) == 4 and len(refused) == 4
    assert {e.code for e in refused} == {"context_length_exceeded"}
    for t in trajs:
        assert t.stop_reason is StopReason.MAX_TOKENS and t.reward == 0.0
        assert 0 < len(t.token_ids) - t.prompt_len <= 24
        assert t.turns[-1].finish_reason == "length" or len(t.turns) > 1


async def test_an_agent_that_raises_is_an_env_error_and_siblings_continue(
    tokenizer: Any,
) -> None:
    async def flaky(task: Task, client: Any) -> str:
        if task.id == "odd":
            raise RuntimeError("the agent broke")
        return await calc_agent(task, client)

    played = await _play(tokenizer, flaky)
    _assert_fine(played["ok"])
    for t in played["odd"]:
        assert t.stop_reason is StopReason.ENV_ERROR and t.failed
        assert t.error == "the agent raised RuntimeError: the agent broke"
        assert t.token_ids == () and t.reward == 0.0


@dataclass
class _Program:
    """An :class:`AgentProgram` that is no AgentEnv: what the loop reads is the protocol."""

    agent: Any = calc_agent
    model: str = "agentloop"
    max_turns: int | None = None
    max_tokens: int | None = None
    timeout_s: float | None = None
    closed: int = 0

    def score(self, task: Task, answer: str | None) -> float:
        return float(answer is not None and "\\boxed{7}" in answer)

    async def close(self) -> None:
        self.closed += 1


class _ProgramEnv(Env):
    def __init__(self, program: _Program) -> None:
        self.program = program

    def agent_program(self) -> AgentProgram:
        return self.program

    async def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        raise AssertionError("an agent program's episode is not stepped")

    async def step(self, action: Any) -> Any:
        raise AssertionError("an agent program's episode is not stepped")


async def test_any_env_that_declares_an_agent_program_is_played_through_the_proxy(
    tokenizer: Any,
) -> None:
    program = _Program()
    groups = await collect(
        TASKS[:1], lambda: _ProgramEnv(program), _engine(tokenizer), TokenBuilder(tokenizer),
        config=RolloutConfig(max_turns=4), group_size=2,
    )  # fmt: skip
    [group] = groups
    assert len(group.trajectories) == 2 and program.closed == 2
    for t in group.trajectories:
        assert t.stop_reason is StopReason.DONE and t.reward == 1.0, t.error
        assert len(t.turns) == 2 and t.num_trained_tokens > 0  # the tool call, then the answer
