"""The code-interpreter tool: per-episode sandbox sessions, formatting, failures as observations."""

from __future__ import annotations

import pytest
from sbx_helpers import SUITE_LIMITS, needs_bwrap

from agentloop.sandboxes import ExecResult, FakeSandbox, make_sandbox
from agentloop.tools import Toolset
from agentloop.tools.code_interpreter import code_interpreter_tool, format_exec_result
from agentloop.types import ToolCall


def call(code: str) -> ToolCall:
    return ToolCall("code_interpreter", {"code": code}, id="c1")


def test_schema_and_formatting() -> None:
    t = code_interpreter_tool(FakeSandbox())
    assert t.name == "code_interpreter" and t.context_param is not None
    assert list(t.parameters["properties"]) == ["code"]
    assert "persist" in t.description
    assert format_exec_result(ExecResult("4\n", "", 0)) == "4"
    assert "use print()" in format_exec_result(ExecResult("", "", 0))
    err = format_exec_result(ExecResult("", "Traceback...\nNameError: x\n", 1))
    assert err == "[stderr]\nTraceback...\nNameError: x"
    slow = format_exec_result(ExecResult("partial\n", "", 137, timed_out=True), 5)
    assert slow.startswith("partial\nError: the code ran past its time limit of 5s")
    oom = format_exec_result(ExecResult("", "", 137, oom_killed=True))
    assert "ran out of memory" in oom
    assert "print less" in format_exec_result(ExecResult("x" * 10, "", 0, truncated=True))
    assert format_exec_result(ExecResult("", "", 3)) == "(exit status 3)"


async def test_each_episode_gets_its_own_session_closed_with_it() -> None:
    sb = FakeSandbox()
    tools = Toolset([code_interpreter_tool(sb)])
    async with tools.session() as ep1, tools.session() as ep2:
        await ep1.dispatch([call("x = 40")])
        (r1,) = await ep1.dispatch([call("print(x + 2)")])
        (r2,) = await ep2.dispatch([call("print(x)")])
        assert r1.content == "42" and r1.error_kind is None
        assert "NameError" in r2.content
        assert sb.open_sessions == 2
    assert sb.open_sessions == 0


async def test_sandbox_failure_becomes_an_error_observation() -> None:
    tools = Toolset([code_interpreter_tool(FakeSandbox(fail_after=0))])
    async with tools.session() as ep:
        (res,) = await ep.dispatch([call("print(1)")])
    assert res.error_kind is not None and "sandbox could not run the code" in res.content


@pytest.mark.integration
@needs_bwrap
async def test_code_interpreter_on_the_local_sandbox() -> None:
    async with make_sandbox("local", limits=SUITE_LIMITS, pool_size=1) as sb:
        tools = Toolset([code_interpreter_tool(sb, timeout_s=2)])
        async with tools.session() as ep:
            (a,) = await ep.dispatch([call("import math\nr = math.isqrt(1522756)")])
            (b,) = await ep.dispatch([call("print(r)\nopen('/etc/hostname')")])
            (c,) = await ep.dispatch([call("while True:\n    pass")])
        assert a.content.startswith("(no output")
        assert b.content.startswith("1234\n[stderr]") and "FileNotFoundError" in b.content
        assert "time limit of 2s" in c.content and "lost" in c.content
