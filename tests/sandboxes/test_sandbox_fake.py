"""FakeSandbox: scripted results, in-process execution with per-session state, failure injection."""

from __future__ import annotations

import pytest

from agentloop.errors import ConfigError, SandboxError
from agentloop.sandboxes import ExecResult, FakeSandbox, Sandbox, make_sandbox


async def test_fake_satisfies_the_protocol_and_executes_in_process() -> None:
    async with FakeSandbox() as sb:
        assert isinstance(sb, Sandbox)
        res = await sb.run("print(6 * 7)")
        assert res == ExecResult("42\n", "", 0, duration_s=res.duration_s)
        bad = await sb.run("raise ValueError('boom')")
        assert bad.exit_code == 1 and "ValueError: boom" in bad.stderr
        assert (await sb.run("import sys; sys.exit(3)")).exit_code == 3
        assert (await sb.run("print(input())", stdin="hi")).stdout == "hi\n"
        assert (await sb.run("print(x)")).exit_code == 1  # one-shot runs share nothing


async def test_fake_sessions_keep_state_and_never_share_it() -> None:
    sb = make_sandbox("fake")
    async with sb.session() as a, sb.session() as b:
        await a.run("x = 1")
        await b.run("x = 2")
        assert (await a.run("print(x)")).stdout == "1\n"
        assert (await b.run("print(x)")).stdout == "2\n"
        assert sb.open_sessions == 2
    assert sb.open_sessions == 0
    assert [c.session_id for c in sb.calls][:2] == [a.id, b.id]


async def test_fake_script_and_failures() -> None:
    sb = FakeSandbox(["first", ExecResult("", "oops", 1, timed_out=True)], fail_after=3)
    assert (await sb.run("a")).stdout == "first"
    assert (await sb.run("b")).timed_out
    with pytest.raises(SandboxError, match="script exhausted"):
        await sb.run("c")
    sb2 = FakeSandbox(lambda code, ns: code.upper(), fail_after=1)
    assert (await sb2.run("x", files={"f.txt": "1"})).stdout == "X"
    assert sb2.calls[0].files == {"f.txt": b"1"}
    with pytest.raises(SandboxError, match="simulated backend failure"):
        await sb2.run("y")
    with pytest.raises(ConfigError):
        await sb2.run("z", language="cobol")
