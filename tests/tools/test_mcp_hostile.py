"""MCP servers that misbehave, against a real SDK server (tests/tools/hostile_mcp_server.py):
a backtracking schema pattern and a big image never stall the event loop, an image for a text
model is a notice, and a server tool named like an env tool takes it over only when asked."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.fake import FakeEngine
from agentloop.envs import ToolEnv
from agentloop.errors import ConfigError
from agentloop.eval import EnvMaker
from agentloop.rollout import RolloutConfig
from agentloop.tools import ToolErrorKind
from agentloop.tools.mcp import MCPServerSpec, mcp_tools
from agentloop.types import Message, Task, ToolCall

# Each test starts MCP server processes (≈2 s each on a loaded 2-core machine).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVER = Path(__file__).with_name("hostile_mcp_server.py")
COMMAND = f"{sys.executable} {SERVER}"
T = TypeVar("T")


def _spec(**options: Any) -> MCPServerSpec:
    return MCPServerSpec(command=(sys.executable, str(SERVER)), startup_timeout_s=60.0, **options)


async def _max_lag(work: Awaitable[T]) -> tuple[T, float]:
    """``work``'s result and the event loop's longest stall meanwhile (a 10 ms heartbeat)."""
    lag = [0.0]

    async def heartbeat() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            lag[0] = max(lag[0], now - last - 0.01)
            last = now

    beat = asyncio.create_task(heartbeat())
    try:
        return await work, lag[0]
    finally:
        beat.cancel()


async def test_a_backtracking_schema_pattern_never_stalls_the_loop() -> None:
    """``^(a|aa)+$`` against 45 a's and a '!': minutes of ``re`` backtracking (with the GIL
    held). Checked off the loop under the tool's deadline, it is a timeout observation."""
    env = ToolEnv(mcp_tools(_spec(timeout_s=2.0)), lambda task, messages: 0.0)
    await env.reset(options={"task": Task("t", {"prompt": "x"})})
    try:
        await env.step(Message("assistant", "", (ToolCall("add", {"a": 1, "b": 2}),)))  # started
        step = env.step(Message("assistant", "", (ToolCall("redos", {"s": "a" * 45 + "!"}),)))
        result, lag = await _max_lag(step)
        (slow,) = result.tool_results
        assert slow.error_kind is ToolErrorKind.TIMEOUT, slow.content
        assert "'^(a|aa)+$'" in slow.content and "2.0s" in slow.content
        assert lag < 0.2, f"the loop stalled {lag:.2f}s"
        fine = await env.step(
            Message(
                "assistant", "", (ToolCall("redos", {"s": "aaaa"}), ToolCall("redos", {"s": "ab"}))
            )
        )
        matched, wrong = fine.tool_results
        assert (matched.content, matched.error_kind) == ("matched", None)
        assert wrong.error_kind is ToolErrorKind.INVALID_ARGUMENTS
        assert "does not match '^(a|aa)+$'" in wrong.content
    finally:
        await env.close()


async def test_a_big_image_for_a_text_model_is_decoded_off_the_loop_and_becomes_a_notice(
    tokenizer: Any,
) -> None:
    """A 12,000² image (a few KB of PNG) to a model without a vision processor: the episode
    goes on with a text notice in place of the image, and decoding it does not stall the loop."""
    tools = mcp_tools(_spec(timeout_s=60.0))
    call = '<tool_call>\n{"name": "screenshot", "arguments": {"side": 12000}}\n</tool_call>'

    def script(prompt_ids: list[int], sampling: Any) -> str:
        return "done" if "<tool_response>" in tokenizer.decode(prompt_ids) else call

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    engine = FakeEngine(script, tokenizer=tokenizer, eos_token_id=eos)
    make_env = lambda: ToolEnv(tools, lambda task, messages: 1.0)  # noqa: E731
    builder = TokenBuilder(tokenizer, tools=make_env().tool_schemas)
    config = RolloutConfig(max_turns=2, max_response_len=512, timeout_s=120)
    tasks = [Task("t", {"prompt": "look"})]
    groups, lag = await _max_lag(collect(tasks, make_env, engine, builder, config=config))
    (episode,) = groups[0].trajectories
    assert episode.stop_reason.value == "done", episode.error
    (tool_message,) = [m for m in episode.messages if m.role == "tool"]
    assert tool_message.images == ()
    assert "1 image(s) not shown: this model reads text only" in tool_message.content
    assert lag < 0.2, f"the loop stalled {lag:.2f}s"


def test_a_server_tool_named_like_an_env_tool_replaces_it_only_when_asked() -> None:
    """Calc's ``python`` runs in agentloop's sandbox; the server's ``python`` would run the
    model's code elsewhere: a ConfigError naming both and the fix, unless ``replace=python``."""
    fake = {"sandbox": "fake"}
    with pytest.raises(ConfigError) as caught:
        EnvMaker("agentloop/Calc-v0", fake, (f"mcp:{COMMAND}",))()
    message = str(caught.value)
    assert "'python'" in message and f"the MCP server {COMMAND!r}" in message
    assert "agentloop.tools" in message  # the env's own tool, by its module
    assert "mcp[replace=python]:" in message and "include=" in message

    env = EnvMaker("agentloop/Calc-v0", fake, (f"mcp[replace=python]:{COMMAND}",))()
    assert isinstance(env, ToolEnv)
    assert env.toolset.get("python").origin == f"the MCP server {COMMAND!r}"
    assert json.dumps(env.tool_schemas).count('"name": "python"') == 1
    # the other tools of the server are added beside Calc's
    assert {"add", "redos", "screenshot"} <= set(env.toolset.names)
