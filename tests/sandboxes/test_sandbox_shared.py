"""shared_sandbox: one started instance per event loop and backend, closed when the loop ends."""

from __future__ import annotations

import asyncio

from agentloop.errors import SandboxError
from agentloop.sandboxes import FakeSandbox, register_sandbox, shared_sandbox
from agentloop.tools import Toolset
from agentloop.tools.code_interpreter import code_interpreter_tool
from agentloop.types import ToolCall


def test_one_per_loop_closed_at_loop_shutdown() -> None:
    seen: list[FakeSandbox] = []

    async def use() -> None:
        a, b = await asyncio.gather(shared_sandbox("fake"), shared_sandbox("fake"))
        assert a is b and isinstance(a, FakeSandbox) and a.started
        seen.append(a)

    asyncio.run(use())
    asyncio.run(use())
    assert seen[0] is not seen[1]  # asyncio resources belong to one loop
    assert not seen[0].started and not seen[1].started  # closed by asyncio.run's shutdown


class FlakyStart(FakeSandbox):
    """Fails its first start, like a backend that was briefly unavailable."""

    starts = 0

    async def start(self) -> None:
        FlakyStart.starts += 1
        if FlakyStart.starts == 1:
            raise SandboxError("engine not up yet")
        await super().start()


def test_a_failed_start_is_an_error_observation_and_is_retried() -> None:
    register_sandbox("flaky-test", FlakyStart, replace=True)
    tools = Toolset([code_interpreter_tool("flaky-test", name="python")])
    call = ToolCall("python", {"code": "print(6 * 7)"}, id="c")

    async def episode() -> list[str]:
        async with tools.session() as ep:
            return [(await ep.dispatch([call]))[0].content for _ in range(2)]

    first, second = asyncio.run(episode())
    assert "sandbox could not run the code: engine not up yet" in first
    assert second == "42"
