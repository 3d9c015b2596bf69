"""The rollout loop: token-exact trajectories, one mask, named tool errors, deadlines, limits."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.base import SamplingParams
from agentloop.engines.fake import FakeEngine
from agentloop.envs import Env, StepResult, ToolEnv
from agentloop.errors import ToolFatalError
from agentloop.rollout import RolloutConfig, rollout
from agentloop.tools import tool
from agentloop.types import Message, StopReason, Task, Trajectory

TOOL_IDS = range(3, 7)  # <tool_call> </tool_call> <tool_response> </tool_response> (tiny model)


@tool
def echo(text: str) -> str:
    """Echo the text back.

    Args:
        text: What to echo.
    """
    return text


@tool
def boom(reason: str) -> str:
    """Always fails.

    Args:
        reason: Shown in the error.
    """
    raise RuntimeError(f"boom: {reason}")


@tool
def fatal(reason: str) -> str:
    """Fails so badly the episode must stop.

    Args:
        reason: Shown in the error.
    """
    raise ToolFatalError(f"sandbox lost: {reason}")


@tool(timeout_s=0.2)
async def hang(seconds: float) -> str:
    """Sleeps longer than its timeout.

    Args:
        seconds: How long to sleep.
    """
    await asyncio.sleep(seconds)
    return "woke up"


def answer_reward(task: Task, messages: Sequence[Message]) -> float:
    return float("\\boxed{" in messages[-1].content)


def make_env() -> ToolEnv:
    return ToolEnv([echo, boom, fatal, hang], answer_reward, system_prompt="Use tools.")


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture(scope="module")
def builder(tokenizer: Any) -> TokenBuilder:
    return TokenBuilder(tokenizer, tools=make_env().tool_schemas)


def play(
    builder: TokenBuilder, engine: FakeEngine, config: RolloutConfig | None = None, n: int = 1
) -> list[Trajectory]:
    tasks = [Task(f"t{i}", {"prompt": f"question {i}"}) for i in range(n)]
    groups = asyncio.run(
        collect(tasks, make_env, engine, builder, config=config or RolloutConfig(), concurrency=8)
    )
    return [t for g in groups for t in g.trajectories]


def assert_token_exact(traj: Trajectory, engine: FakeEngine) -> None:
    """Trajectory ids == prompt + every sampled id + every observation suffix, in order; mask 1
    exactly on sampled ids; logprobs are the engine's there and 0 elsewhere."""
    requests = [r for r in engine.requests if r.session_id == f"{traj.task_id}#0"]
    assert requests, "the engine was never called"
    assert list(requests[0].prompt_ids) == list(traj.token_ids[: traj.prompt_len])
    mask = [0] * traj.prompt_len
    logprobs = [0.0] * traj.prompt_len
    for j, req in enumerate(requests):
        assert traj.token_ids[: len(req.prompt_ids)] == req.prompt_ids
        if j:  # what came between two requests is an observation: never trained on
            mask += [0] * (len(req.prompt_ids) - len(mask))
            logprobs += [0.0] * (len(req.prompt_ids) - len(logprobs))
        sampled = req.completion.token_ids
        end = len(req.prompt_ids) + len(sampled)
        assert traj.token_ids[len(req.prompt_ids) : end] == sampled
        mask += [1] * len(sampled)
        logprobs += list(req.completion.logprobs)
    assert len(traj.token_ids) == len(mask), "tokens after the last sample"
    assert list(traj.loss_mask) == mask
    assert list(traj.logprobs) == logprobs
    trained = {t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m}
    assert not trained & set(TOOL_IDS[2:]), "a <tool_response> id is under mask 1"


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_token_exact_on_random_ids(builder: TokenBuilder, tokenizer: Any, seed: int) -> None:
    rng = random.Random(seed)
    eos = tokenizer.eos_token_id
    normal_ids = [i for i in range(len(tokenizer)) if i > max(TOOL_IDS)]

    def script(prompt_ids: Sequence[int], sampling: SamplingParams) -> list[int]:
        noise = rng.choices(normal_ids, k=rng.randint(1, 12))  # need not round-trip
        if rng.random() < 0.7:  # call a tool, often with arguments that need the budget cut
            noise += builder.encode(call("echo", text="x" * rng.randint(1, 400)))
        return [*noise, eos] if rng.random() < 0.9 else noise  # sometimes cut by length

    engine = FakeEngine(script, eos_token_id=eos)
    config = RolloutConfig(max_turns=5, max_response_len=400, max_tool_output_tokens=40)
    (traj,) = play(builder, engine, config)
    assert not traj.failed, traj.error
    assert_token_exact(traj, engine)
    # Per-turn budgets: each request may sample only what is left of max_response_len.
    for req in engine.requests:
        assert req.sampling.max_tokens == 400 - (len(req.prompt_ids) - traj.prompt_len)


def test_random_ids_include_non_round_tripping_sequences(tokenizer: Any) -> None:
    rng = random.Random(0)
    samples = [rng.choices(range(7, len(tokenizer)), k=8) for _ in range(200)]
    changed = sum(
        tokenizer.encode(tokenizer.decode(s), add_special_tokens=False) != s for s in samples
    )
    assert changed > 0  # the property test above really exercises ids that do not round-trip


def test_bad_tool_calls_become_named_errors_and_the_episode_goes_on(
    builder: TokenBuilder, tokenizer: Any
) -> None:
    bad_turn = "\n".join(
        [
            "<tool_call>\n{not json}\n</tool_call>",
            call("nope", x=1),
            call("echo", txt="wrong name"),
            call("boom", reason="test"),
            call("hang", seconds=30),
            call("echo", text="still works"),
        ]
    )
    engine = FakeEngine([bad_turn, "done \\boxed{1}"], tokenizer=tokenizer, eos_token_id=2)
    (traj,) = play(builder, engine, RolloutConfig(max_tool_output_tokens=200))
    assert traj.stop_reason is StopReason.DONE and traj.reward == 1.0
    tool_msgs = [m for m in traj.messages if m.role == "tool"]
    assert len(tool_msgs) == 6
    assert all(m.content.startswith("Error:") for m in tool_msgs[:5])
    assert "JSON" in tool_msgs[0].content
    assert "nope" in tool_msgs[1].content and "echo" in tool_msgs[1].content
    assert "text" in tool_msgs[2].content
    assert "boom: test" in tool_msgs[3].content
    assert "timed out" in tool_msgs[4].content
    assert tool_msgs[5].content == "still works"
    for kind in ("invalid_json", "unknown_tool", "invalid_arguments", "tool_exception", "timeout"):
        assert traj.metrics[f"tool_error/{kind}"] == 1.0
    assert traj.turns[0].tool_calls == 6 and traj.turns[0].tool_errors == 5
    assert traj.turns[0].env_latency_s < 5  # the hanging tool was cut at its 0.2 s timeout
    assert_token_exact(traj, engine)


def test_failures_stay_in_their_episode(builder: TokenBuilder, tokenizer: Any) -> None:
    def script(prompt_ids: Sequence[int], sampling: SamplingParams) -> str:
        text = tokenizer.decode(prompt_ids)
        if "<tool_response>" in text:
            return "\\boxed{ok}"
        if "question 1" in text:
            return call("fatal", reason="t1")
        if "question 2" in text:
            return call("boom", reason="t2")
        return call("echo", text="fine")

    engine = FakeEngine(script, tokenizer=tokenizer, eos_token_id=2)
    trajs = play(builder, engine, n=4)
    by_task = {t.task_id: t for t in trajs}
    assert by_task["t1"].stop_reason is StopReason.TOOL_FATAL
    assert "sandbox lost: t1" in (by_task["t1"].error or "")
    for task_id in ("t0", "t2", "t3"):
        assert by_task[task_id].stop_reason is StopReason.DONE
        assert by_task[task_id].reward == 1.0


def test_engine_error_is_recorded(builder: TokenBuilder, tokenizer: Any) -> None:
    engine = FakeEngine([call("echo", text="a")], tokenizer=tokenizer, eos_token_id=2)
    (traj,) = play(builder, engine)  # the script has one response; turn 2 fails
    assert traj.stop_reason is StopReason.ENGINE_ERROR
    assert "script has 1 responses" in (traj.error or "")
    assert traj.turns and traj.num_trained_tokens > 0  # what was built is kept


def test_deadline_cuts_a_slow_episode(builder: TokenBuilder, tokenizer: Any) -> None:
    engine = FakeEngine(lambda p, s: call("hang", seconds=0.15), tokenizer=tokenizer,
                        eos_token_id=2, latency_s=0.05)  # fmt: skip
    (traj,) = play(builder, engine, RolloutConfig(timeout_s=0.5, max_turns=100))
    assert traj.stop_reason is StopReason.TIMEOUT
    assert "timeout_s=0.5" in (traj.error or "")


def test_limits(builder: TokenBuilder, tokenizer: Any) -> None:
    always_call = FakeEngine(lambda p, s: call("echo", text="a"), tokenizer=tokenizer,
                             eos_token_id=2)  # fmt: skip
    (traj,) = play(builder, always_call, RolloutConfig(max_turns=3))
    assert traj.stop_reason is StopReason.MAX_TURNS and len(traj.turns) == 3

    (traj,) = play(builder, always_call, RolloutConfig(max_prompt_len=10))
    assert traj.stop_reason is StopReason.CONTEXT_OVERFLOW and "max_prompt_len=10" in traj.error

    rambler = FakeEngine(lambda p, s: "x" * 500, tokenizer=tokenizer, eos_token_id=2)
    (traj,) = play(builder, rambler, RolloutConfig(max_response_len=50))
    assert traj.stop_reason is StopReason.MAX_TOKENS
    assert len(traj.response_ids) == 50


def test_tool_output_is_cut_to_its_token_budget(builder: TokenBuilder, tokenizer: Any) -> None:
    engine = FakeEngine([call("echo", text="y " * 2000), "\\boxed{1}"], tokenizer=tokenizer,
                        eos_token_id=2)  # fmt: skip
    (traj,) = play(builder, engine, RolloutConfig(max_tool_output_tokens=64, max_response_len=4096))
    (tool_msg,) = [m for m in traj.messages if m.role == "tool"]
    assert "truncated" in tool_msg.content
    assert len(builder.encode(tool_msg.content)) <= 64
    assert traj.stop_reason is StopReason.DONE


def test_env_is_closed_on_every_exit_path(builder: TokenBuilder, tokenizer: Any) -> None:
    closed: list[str] = []

    class Tracked(ToolEnv):
        async def close(self) -> None:
            if self._task is not None:
                closed.append(self._task.id)
            await super().close()

    async def run_and_cancel() -> None:
        env = Tracked([echo], answer_reward)
        engine = FakeEngine(lambda p, s: call("echo", text="a"), tokenizer=tokenizer,
                            eos_token_id=2, latency_s=10)  # fmt: skip
        job = asyncio.ensure_future(
            rollout(env, engine, builder, Task("c", {"prompt": "q"}), RolloutConfig())
        )
        await asyncio.sleep(0.1)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job

    asyncio.run(run_and_cancel())
    assert closed == ["c"]


def test_a_builder_made_for_another_env_is_an_error(tokenizer: Any) -> None:
    """The tour's trap: ``make_builder(tok, "agentloop/Calc-v0")`` reused with another env would
    prompt the model with Calc's python tool and hide the env's own."""
    from agentloop.collect import make_builder
    from agentloop.envs import register
    from agentloop.errors import ConfigError

    @tool
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        return key

    register("test/Lookup-v0", lambda: ToolEnv([lookup], lambda t, m: 0.0), override=True)
    builder = make_builder(tokenizer, "agentloop/Calc-v0")
    task = Task("t0", {"prompt": "find x"})
    with pytest.raises(
        ConfigError,
        match=r"shows the model the tools \['python'\], but env 'test/Lookup-v0' has \['lookup'\]"
        r"; build one for this env: make_builder\(tokenizer, 'test/Lookup-v0'\)",
    ):
        asyncio.run(collect([task], "test/Lookup-v0", FakeEngine(["hi"]), builder,
                            config=RolloutConfig()))  # fmt: skip
    right = make_builder(tokenizer, "test/Lookup-v0")
    engine = FakeEngine(["done"], tokenizer=tokenizer)
    [group] = asyncio.run(collect([task], "test/Lookup-v0", engine, right, config=RolloutConfig()))
    assert group.trajectories[0].stop_reason is StopReason.DONE


class _ThreeTurns(Env):
    """Answers every turn with a fixed user message, whatever the model wrote; done after 3."""

    def __init__(self) -> None:
        self.turn = 0

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        self.turn = 0
        return [Message("user", (options or {})["task"].data["prompt"])], {}

    async def step(self, action: Message) -> StepResult:
        self.turn += 1
        if self.turn >= 3:
            return StepResult([], 1.0, terminated=True, truncated=False)
        return StepResult([Message("user", "go on")], 0.0, terminated=False, truncated=False)


def test_max_turn_tokens_caps_each_turn_and_the_episode_goes_on(
    builder: TokenBuilder, tokenizer: Any
) -> None:
    rambler = FakeEngine(lambda p, s: "x" * 500, tokenizer=tokenizer, eos_token_id=2)
    config = RolloutConfig(max_turns=5, max_response_len=200, max_turn_tokens=30)
    task = Task("t0", {"prompt": "question"})
    traj = asyncio.run(rollout(_ThreeTurns(), rambler, builder, task, config))
    assert traj.stop_reason is StopReason.DONE and traj.reward == 1.0
    assert [t.completion_tokens for t in traj.turns] == [30, 30, 30]
    assert [t.finish_reason for t in traj.turns] == ["length"] * 3
    assert [r.sampling.max_tokens for r in rambler.requests] == [30, 30, 30]
    assert sum(traj.loss_mask) == 90  # the observations between the turns stay masked
    assert_token_exact(traj, rambler)

    # the response budget still wins where less is left than the cap: that cut ends the episode
    rambler = FakeEngine(lambda p, s: "x" * 500, tokenizer=tokenizer, eos_token_id=2)
    config = RolloutConfig(max_turns=5, max_response_len=70, max_turn_tokens=30)
    traj = asyncio.run(rollout(_ThreeTurns(), rambler, builder, task, config))
    assert traj.stop_reason is StopReason.MAX_TOKENS
    assert rambler.requests[-1].sampling.max_tokens < 30
    assert len(traj.response_ids) == 70


def test_max_turn_tokens_is_checked() -> None:
    from agentloop.errors import ConfigError

    with pytest.raises(ConfigError, match=r"rollout.max_turn_tokens must be >= 1 or null .* got 0"):
        RolloutConfig(max_turn_tokens=0)
