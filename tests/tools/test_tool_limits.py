"""Tool limits that hold: per tool name across episodes, set from env configs, timeouts counted."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from waits import eventually

from agentloop.cli.common import key_values as _key_values
from agentloop.envs import make
from agentloop.tools import Toolset, tool
from agentloop.tools.runtime import runtime_stats
from agentloop.tools.search import FakeRetriever, Passage, search_tool
from agentloop.tools.tool import Tool
from agentloop.types import ToolCall

EPISODES = 8


def _episode_tools(fn: Any, **limits: Any) -> Toolset:
    """A fresh Tool per episode, as envs build them (``make`` per episode)."""
    return Toolset([tool(name="limited", **limits)(fn)])


async def _play(toolsets: list[Toolset], calls_per_episode: int = 2) -> list[Any]:
    async def episode(tools: Toolset) -> list[Any]:
        results = []
        async with tools.session() as session:
            for i in range(calls_per_episode):
                results += await session.dispatch([ToolCall("limited", {}, id=f"c{i}")])
        return results

    per_episode = await asyncio.gather(*(episode(t) for t in toolsets))
    return [r for rs in per_episode for r in rs]


async def test_async_tool_limit_holds_across_episodes_that_rebuild_the_tool() -> None:
    stats = {"now": 0, "max": 0}

    async def limited() -> str:
        """Counts calls in flight."""
        stats["now"] += 1
        stats["max"] = max(stats["max"], stats["now"])
        await asyncio.sleep(0.01)  # the work: every episode's call is in flight at once
        stats["now"] -= 1
        return "ok"

    toolsets = [_episode_tools(limited, max_concurrency=2) for _ in range(EPISODES)]
    limiters = {id(ts.get("limited").limiter) for ts in toolsets}
    assert len(limiters) == 1  # one limiter per tool name and limits, not per Tool object
    results = await _play(toolsets)
    assert [r.content for r in results] == ["ok"] * 2 * EPISODES
    assert stats["max"] == 2


async def test_async_timeouts_across_episodes_free_their_slots_when_cancelled() -> None:
    stats = {"now": 0, "max": 0}

    async def limited() -> str:
        """Never finishes in time; it is cancelled at the deadline."""
        stats["now"] += 1
        stats["max"] = max(stats["max"], stats["now"])
        try:
            await asyncio.Event().wait()
        finally:
            stats["now"] -= 1
        return "unreachable"

    toolsets = [_episode_tools(limited, max_concurrency=1, timeout_s=0.02) for _ in range(4)]
    results = await _play(toolsets, calls_per_episode=1)
    assert [r.error_kind for r in results] == ["timeout"] * 4
    assert stats == {"now": 0, "max": 1}


async def test_a_timed_out_sync_call_holds_its_slot_until_its_thread_ends() -> None:
    """``max_concurrency=1`` counts running threads: the next episode's call starts only when
    the abandoned thread returns, and the abandoned thread is counted meanwhile."""
    lock, events, state = threading.Lock(), [], {"now": 0, "max": 0}
    released = threading.Event()
    before = runtime_stats()

    def limited() -> str:
        """The first call blocks past its deadline; the others return at once."""
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
            first = not events
            events.append("start")
        if first:
            released.wait(1.0)  # a bug (slot freed at the deadline) would let another start
        else:
            released.set()
        with lock:
            state["now"] -= 1
            events.append("end")
        return "ok"

    toolsets = [_episode_tools(limited, max_concurrency=1, timeout_s=0.3) for _ in range(3)]
    results = await _play(toolsets, calls_per_episode=1)
    assert sorted(str(r.error_kind) for r in results) == ["None", "None", "timeout"]
    assert state["max"] == 1
    assert events == ["start", "end"] * 3  # strictly one thread at a time
    after = runtime_stats()
    assert after.abandoned_total == before.abandoned_total + 1
    await eventually(lambda: runtime_stats().abandoned_running == before.abandoned_running)


async def test_the_rate_limit_spaces_call_starts_across_episodes() -> None:
    starts: list[float] = []

    async def limited() -> str:
        """Records when it started."""
        starts.append(time.monotonic())
        return "ok"

    toolsets = [_episode_tools(limited, rate_limit_per_s=40) for _ in range(EPISODES)]
    results = await _play(toolsets)  # every episode calls at once, twice
    assert [r.content for r in results] == ["ok"] * 2 * EPISODES
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 1 / 40 - 1e-3, gaps  # at most 40 starts a second, whatever the episode


@pytest.mark.parametrize(
    ("env_id", "tool", "extra"),
    [
        ("agentloop/Calc-v0", "python", ["sandbox=fake"]),
        ("agentloop/MathTool-v0", "code_interpreter", ["sandbox=fake", "files={FILES}"]),
        ("agentloop/SearchQA-v0", "search", ["retriever=http://127.0.0.1:9"]),
        ("agentloop/SearchR1-v0", "search", ["retriever=http://127.0.0.1:9", "files={FILES}"]),
    ],
)
def test_built_in_tool_limits_come_from_the_env_config(
    env_id: str, tool: str, extra: list[str], tmp_path: Path
) -> None:
    """``tool_max_concurrency`` / ``tool_rate_limit_per_s`` given as ``--env-arg`` (the same
    mapping as YAML env_kwargs) reach the built-in tools, shared by every env instance (one per
    episode)."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": "q", "answer": "1" if "Math" in env_id else ["1"]}))
    files = json.dumps({"train": str(tasks)})
    args = [e.replace("{FILES}", files) for e in extra]
    kwargs = _key_values([*args, "tool_max_concurrency=3", "tool_rate_limit_per_s=5"])
    a, b = make(env_id, **kwargs), make(env_id, **kwargs)
    ta, tb = a.toolset.get(tool), b.toolset.get(tool)  # type: ignore[attr-defined]
    assert ta is not tb and ta.limiter is tb.limiter
    assert ta.limiter.max_concurrency == 3 and ta.limiter.interval_s == 0.2


def test_search_tool_limits_are_shared_by_tool_name() -> None:
    retriever = FakeRetriever([Passage("1", "t", "x")])
    s1: Tool = search_tool(retriever, max_concurrency=2)
    s2: Tool = search_tool(retriever, max_concurrency=2)
    assert s1.limiter is s2.limiter and s1.limiter.max_concurrency == 2
