"""Toolset dispatch: error kinds, timeouts, fatal errors, concurrency and rate limits."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import pytest

from agentloop.errors import ToolError, ToolFatalError
from agentloop.tools import (
    ToolErrorKind,
    ToolResult,
    Toolset,
    get_parser,
    tool,
)
from agentloop.tools import runtime as tool_runtime
from agentloop.types import Message, ToolCall


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First.
        b: Second.
    """
    return a + b


@tool
async def echo(text: str) -> str:
    """Echo text back.

    Args:
        text: The text.
    """
    await asyncio.sleep(0)
    return text


@tool
def explode(message: str) -> str:
    """Always fails.

    Args:
        message: What to fail with.
    """
    raise ValueError(message)


@tool
def info() -> dict[str, object]:
    """Structured output."""
    return {"ok": True, "n": [1, 2], "name": "π"}


@tool
def unserializable() -> object:
    """Returns something that is not JSON."""
    return {1, 2}


def call(name: str, i: int = 0, **arguments: object) -> ToolCall:
    return ToolCall(name=name, arguments=arguments, id=f"call_{i}")


async def dispatch(toolset: Toolset, calls: list[ToolCall]) -> list[ToolResult]:
    async with toolset.session() as session:
        return await session.dispatch(calls)


async def test_success_results_and_messages() -> None:
    results = await dispatch(
        Toolset([add, echo, info]),
        [call("add", 0, a=2, b=3), call("echo", 1, text="hi"), call("info", 2)],
    )
    assert [r.content for r in results] == ["5", "hi", '{"ok": true, "n": [1, 2], "name": "π"}']
    assert all(r.error_kind is None and not r.is_error and r.latency_s >= 0 for r in results)
    assert results[1].to_message() == Message(
        role="tool", content="hi", name="echo", tool_call_id="call_1"
    )


async def test_each_bad_call_kind_is_a_named_error_and_the_rest_still_run() -> None:
    @tool(timeout_s=0.05)
    async def slow() -> str:
        """Too slow."""
        await asyncio.sleep(5)
        return "never"

    text = (
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": }}</tool_call>'
        '<tool_call>{"name": "ad", "arguments": {"a": 1, "b": 2}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": "one"}}</tool_call>'
        '<tool_call>{"name": "explode", "arguments": {"message": "kaboom"}}</tool_call>'
        '<tool_call>{"name": "slow", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 40, "b": 2}}</tool_call>'
    )
    calls = get_parser("hermes").parse(text)
    results = await dispatch(Toolset([add, explode, slow]), list(calls))
    kinds = [r.error_kind for r in results]
    assert kinds == [
        ToolErrorKind.INVALID_JSON,
        ToolErrorKind.UNKNOWN_TOOL,
        ToolErrorKind.INVALID_ARGUMENTS,
        ToolErrorKind.TOOL_EXCEPTION,
        ToolErrorKind.TIMEOUT,
        None,
    ]
    assert [k.value for k in ToolErrorKind] == [
        "invalid_json",
        "unknown_tool",
        "invalid_arguments",
        "tool_exception",
        "timeout",
        "replay_miss",  # only a replayed run (agentloop.tools.recording) gives it
    ]
    assert all(r.content.startswith("Error: ") for r in results[:5])
    assert "invalid JSON" in results[0].content
    assert "unknown tool 'ad'. Did you mean 'add'? Available tools: add, explode, slow." in (
        results[1].content
    )
    assert "'a': Input should be a valid integer" in results[2].content
    assert "'b': missing required argument (expected integer)" in results[2].content
    assert results[3].content == "Error: tool 'explode' raised ValueError: kaboom"
    assert "Traceback" not in results[3].content
    assert results[4].content == "Error: tool 'slow' timed out after 0.05s"
    assert results[5].content == "42"
    assert [r.call.id for r in results] == [f"call_{i}" for i in range(6)]
    assert [r.to_message().tool_call_id for r in results] == [f"call_{i}" for i in range(6)]


async def test_tool_error_message_is_shown_without_type_name() -> None:
    @tool
    def picky(x: int) -> str:
        """Picky.

        Args:
            x: A value.
        """
        raise ToolError(f"x must be even, got {x}")

    [result] = await dispatch(Toolset([picky]), [call("picky", x=3)])
    assert result.error_kind is ToolErrorKind.TOOL_EXCEPTION
    assert result.content == "Error: tool 'picky' failed: x must be even, got 3"


async def test_exception_without_message() -> None:
    @tool
    def bare() -> str:
        """Raises a bare exception."""
        raise RuntimeError

    [result] = await dispatch(Toolset([bare]), [call("bare")])
    assert result.content == "Error: tool 'bare' raised RuntimeError"


async def test_unserializable_return_is_an_error() -> None:
    [result] = await dispatch(Toolset([unserializable]), [call("unserializable")])
    assert result.error_kind is ToolErrorKind.TOOL_EXCEPTION
    assert "returned a set, which is not JSON-serializable" in result.content


async def test_hanging_async_tool_is_cancelled_at_timeout() -> None:
    cancelled = asyncio.Event()

    @tool(timeout_s=0.05)
    async def hang() -> str:
        """Hangs."""
        try:
            await asyncio.sleep(60)
        finally:
            cancelled.set()
        return ""

    start = time.monotonic()
    [result] = await dispatch(Toolset([hang]), [call("hang")])
    assert time.monotonic() - start < 1.0
    assert result.error_kind is ToolErrorKind.TIMEOUT
    assert result.content == "Error: tool 'hang' timed out after 0.05s"
    assert cancelled.is_set()


async def test_hanging_sync_tool_is_cut_at_timeout() -> None:
    release = threading.Event()

    @tool(timeout_s=0.05)
    def block() -> str:
        """Blocks."""
        release.wait(10)
        return "late"

    try:
        start = time.monotonic()
        [result, ok] = await dispatch(
            Toolset([block, add]), [call("block"), call("add", 1, a=1, b=1)]
        )
        assert time.monotonic() - start < 1.0
        assert result.error_kind is ToolErrorKind.TIMEOUT and ok.content == "2"
    finally:
        release.set()


def test_hung_sync_tool_does_not_block_loop_shutdown() -> None:
    release = threading.Event()

    @tool(timeout_s=0.05)
    def block() -> str:
        """Blocks."""
        release.wait(10)
        return "late"

    try:
        start = time.monotonic()
        results = asyncio.run(dispatch(Toolset([block]), [call("block")] * 8))
        assert time.monotonic() - start < 2.0  # asyncio.run returns: no executor to wait for
        assert {r.error_kind for r in results} == {ToolErrorKind.TIMEOUT}
    finally:
        release.set()


async def test_tool_that_ignores_cancellation_is_abandoned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tool_runtime, "CANCEL_GRACE_S", 0.05)
    finished = asyncio.Event()

    @tool(timeout_s=0.05)
    async def stubborn() -> str:
        """Swallows cancellation."""
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(0.3)
        finished.set()
        return "done anyway"

    start = time.monotonic()
    [result] = await dispatch(Toolset([stubborn]), [call("stubborn")])
    assert time.monotonic() - start < 0.25
    assert result.error_kind is ToolErrorKind.TIMEOUT
    await asyncio.wait_for(finished.wait(), 2)


async def test_fatal_error_propagates_and_cancels_siblings() -> None:
    sibling_cancelled = asyncio.Event()

    @tool
    async def fatal() -> str:
        """Fatal."""
        await asyncio.sleep(0.01)
        raise ToolFatalError("sandbox is gone")

    @tool
    async def sibling() -> str:
        """Slow sibling."""
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            sibling_cancelled.set()
            raise
        return ""

    with pytest.raises(ToolFatalError, match="sandbox is gone"):
        await dispatch(Toolset([fatal, sibling]), [call("sibling", 0), call("fatal", 1)])
    assert sibling_cancelled.is_set()


async def test_fatal_error_from_sync_tool_propagates() -> None:
    @tool
    def fatal_sync() -> str:
        """Fatal."""
        raise ToolFatalError("quota exhausted")

    with pytest.raises(ToolFatalError, match="quota exhausted"):
        await dispatch(Toolset([fatal_sync]), [call("fatal_sync")])


def make_tracked(limit: int | None) -> tuple[object, dict[str, int]]:
    stats = {"now": 0, "max": 0}

    @tool(max_concurrency=limit)
    async def tracked() -> str:
        """Tracks in-flight calls."""
        stats["now"] += 1
        stats["max"] = max(stats["max"], stats["now"])
        await asyncio.sleep(0.02)
        stats["now"] -= 1
        return "ok"

    return tracked, stats


async def test_per_tool_concurrency_limit_across_sessions() -> None:
    tracked, stats = make_tracked(2)
    toolset = Toolset([tracked], max_parallel=8)  # type: ignore[list-item]
    calls = [call("tracked", i) for i in range(4)]
    results = await asyncio.gather(dispatch(toolset, calls), dispatch(toolset, calls))
    assert all(r.content == "ok" for rs in results for r in rs)
    assert stats["max"] == 2


async def test_max_parallel_bounds_one_turn() -> None:
    tracked, stats = make_tracked(None)
    toolset = Toolset([tracked], max_parallel=3)  # type: ignore[list-item]
    await dispatch(toolset, [call("tracked", i) for i in range(7)])
    assert stats["max"] == 3


def test_concurrency_limit_works_on_several_event_loops() -> None:
    tracked, stats = make_tracked(1)
    toolset = Toolset([tracked])  # type: ignore[list-item]
    for _ in range(2):  # a semaphore bound to the first loop would fail on the second
        results = asyncio.run(dispatch(toolset, [call("tracked", i) for i in range(3)]))
        assert [r.content for r in results] == ["ok"] * 3
    assert stats["max"] == 1


async def test_rate_limit_spaces_call_starts() -> None:
    starts: list[float] = []

    @tool(rate_limit_per_s=20.0)
    async def limited() -> str:
        """Rate limited."""
        starts.append(time.monotonic())
        return "ok"

    await dispatch(Toolset([limited]), [call("limited", i) for i in range(4)])
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(gaps) == 3
    assert all(g >= 0.045 for g in gaps), gaps


async def test_empty_turn_and_closed_session() -> None:
    toolset = Toolset([add])
    session = toolset.session()
    assert await session.dispatch([]) == []
    await session.aclose()
    with pytest.raises(ToolError, match="closed tool session"):
        await session.dispatch([call("add", a=1, b=2)])


def test_toolset_lookup_and_validation() -> None:
    toolset = Toolset([add, echo])
    assert toolset.names == ("add", "echo")
    assert [s["function"]["name"] for s in toolset.schemas] == ["add", "echo"]
    assert toolset.get("add") is add and "echo" in toolset and len(toolset) == 2
    assert list(toolset) == [add, echo]
    with pytest.raises(ToolError, match="Did you mean 'echo'"):
        toolset.get("ecko")
    with pytest.raises(ToolError, match="two tools are named 'add'"):
        Toolset([add, add])
    with pytest.raises(ToolError, match="decorate the function with @tool"):
        Toolset([len])  # type: ignore[list-item]
    with pytest.raises(ToolError, match="max_parallel=0"):
        Toolset([add], max_parallel=0)


async def test_dispatch_cancellation_cancels_running_tools() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    @tool
    async def wait_forever() -> str:
        """Waits."""
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return ""

    task = asyncio.ensure_future(dispatch(Toolset([wait_forever]), [call("wait_forever")]))
    await asyncio.wait_for(started.wait(), 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()
