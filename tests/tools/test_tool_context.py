"""ToolContext: per-episode resources entered once and closed on every exit path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from agentloop.errors import ToolError
from agentloop.tools import ToolContext, ToolErrorKind, Toolset, tool
from agentloop.types import ToolCall


class Resources:
    """A fake resource factory (think: sandbox sessions) that records opens and closes."""

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.closed: list[str] = []

    def factory(self, name: str, fail: bool = False):  # type: ignore[no-untyped-def]
        @asynccontextmanager
        async def cm() -> AsyncIterator[str]:
            await asyncio.sleep(0.005)  # overlapping enters must still open it once
            if fail:
                raise RuntimeError(f"cannot open {name}")
            self.opened.append(name)
            try:
                yield f"<{name}>"
            finally:
                self.closed.append(name)

        return cm


def sandbox_tools(res: Resources, gate: asyncio.Event | None = None) -> Toolset:
    @tool
    async def run(ctx: ToolContext, code: str) -> str:
        """Run code in the episode's sandbox.

        Args:
            code: The code.
        """
        box = await ctx.enter("sandbox", res.factory("sandbox"))
        ctx.state["runs"] = ctx.state.get("runs", 0) + 1
        if gate is not None:
            await gate.wait()
        return f"{box} ran {code} for {ctx.task}"

    return Toolset([run])


def run_call(i: int) -> ToolCall:
    return ToolCall(name="run", arguments={"code": f"c{i}"}, id=f"call_{i}")


async def test_resource_entered_once_and_closed_on_normal_exit() -> None:
    res = Resources()
    toolset = sandbox_tools(res)
    async with toolset.session(task="t1") as session:
        results = await session.dispatch([run_call(i) for i in range(3)])
        results += await session.dispatch([run_call(3)])
        assert session.context.state["runs"] == 4
        assert res.closed == []
    assert results[0].content == "<sandbox> ran c0 for t1"
    assert res.opened == ["sandbox"] and res.closed == ["sandbox"]


async def test_sessions_are_isolated() -> None:
    res = Resources()
    toolset = sandbox_tools(res)
    async with toolset.session() as a, toolset.session() as b:
        await a.dispatch([run_call(0)])
        await b.dispatch([run_call(0)])
        assert a.context.state == {"runs": 1} and b.context.state == {"runs": 1}
    assert res.opened == ["sandbox", "sandbox"] and res.closed == ["sandbox", "sandbox"]


async def test_closed_on_exception() -> None:
    res = Resources()
    toolset = sandbox_tools(res)
    with pytest.raises(KeyError):
        async with toolset.session() as session:
            await session.dispatch([run_call(0)])
            raise KeyError("env bug")
    assert res.closed == ["sandbox"]


async def test_closed_on_cancellation_mid_tool_call() -> None:
    res = Resources()
    gate = asyncio.Event()  # never set: the tool waits until cancelled
    toolset = sandbox_tools(res, gate)

    async def episode() -> None:
        async with toolset.session() as session:
            await session.dispatch([run_call(0)])

    task = asyncio.ensure_future(episode())
    while not res.opened:
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert res.closed == ["sandbox"]


async def test_resources_close_in_reverse_order_and_failed_enter_is_retried() -> None:
    res = Resources()
    ctx = ToolContext(task={"id": 1})
    assert await ctx.enter("a", res.factory("a")) == "<a>"
    with pytest.raises(RuntimeError, match="cannot open b"):
        await ctx.enter("b", res.factory("b", fail=True))
    assert await ctx.enter("b", res.factory("b")) == "<b>"
    assert await ctx.enter("a", res.factory("other")) == "<a>"  # cached by key
    await ctx.aclose()
    await ctx.aclose()  # idempotent
    assert res.opened == ["a", "b"] and res.closed == ["b", "a"]
    assert ctx.closed
    with pytest.raises(ToolError, match="already closed"):
        await ctx.enter("c", res.factory("c"))


async def test_failing_resource_is_a_tool_exception_result() -> None:
    res = Resources()

    @tool
    async def broken(ctx: ToolContext) -> str:
        """Uses a resource that cannot open."""
        return await ctx.enter("x", res.factory("x", fail=True))

    async with Toolset([broken]).session() as session:
        [result] = await session.dispatch([ToolCall(name="broken", id="call_0")])
    assert result.error_kind is ToolErrorKind.TOOL_EXCEPTION
    assert result.content == "Error: tool 'broken' raised RuntimeError: cannot open x"
