"""MCP servers as tools, against real SDK servers (tests/tools/mcp_server.py) over stdio and
streamable HTTP: schemas are the server's, calls return its results, every failure is an
observation, one session per episode is released, and per-tool limits hold across episodes."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from waits import eventually

from agentloop.envs import ToolEnv
from agentloop.errors import ConfigError
from agentloop.tools import ToolErrorKind
from agentloop.tools.mcp import MCPServerSpec, mcp_tools, parse_tool_spec
from agentloop.tools.recording import TAPE_FILE, ToolTapeConfig
from agentloop.tools.tool_specs import SCHEMAS_FILE, spec_tools
from agentloop.types import Message, Task, ToolCall

# Each test starts MCP server processes (≈2 s each on a loaded 2-core machine).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVER = Path(__file__).with_name("mcp_server.py")


def stdio_spec(tmp_flag: Path | None = None, **options: object) -> MCPServerSpec:
    env = {"AGENTLOOP_TEST_MCP_FAIL_IF": str(tmp_flag)} if tmp_flag else {}
    return MCPServerSpec(command=(sys.executable, str(SERVER)), env=env, **options)  # type: ignore[arg-type]


def _env(tools: list) -> ToolEnv:  # type: ignore[type-arg]
    return ToolEnv(tools, lambda task, messages: 0.0)


async def _step(env: ToolEnv, *calls: ToolCall) -> list[tuple[str, ToolErrorKind | None]]:
    result = await env.step(Message("assistant", "", calls))
    return [(r.content, r.error_kind) for r in result.tool_results]


async def test_stdio_tools_are_the_servers_and_work_in_a_tool_env() -> None:
    sys.path.insert(0, str(SERVER.parent))
    from mcp_server import server  # the same server, in-process: what it declares

    declared = {t.name: t for t in await server.list_tools()}
    tools = mcp_tools(stdio_spec(timeout_s=20.0))
    assert {t.name for t in tools} == set(declared)
    for t in tools:
        assert t.parameters == declared[t.name].input_schema
        assert t.description == declared[t.name].description
    assert mcp_tools(stdio_spec(timeout_s=20.0)) == tools  # listed once; limits are shared

    env = _env(tools)
    await env.reset(options={"task": Task("t", {"prompt": "add"})})
    try:
        assert await _step(env, ToolCall("add", {"a": 2, "b": 40})) == [("42", None)]
        ((pid, _),) = await _step(env, ToolCall("pid", {}))
        result = await env.step(Message("assistant", "", (ToolCall("square_image", {"side": 5}),)))
        (image,) = result.tool_results[0].images
        assert image.size == (5, 5) and image.getpixel((0, 0)) == (255, 0, 0)
    finally:
        await env.close()
    # the episode's session — here its server process — is released with the episode
    await eventually(lambda: not psutil.pid_exists(int(pid)) or _zombie(int(pid)))


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or _zombie(pid)


async def _server_pid(env: ToolEnv) -> int:
    ((pid, kind),) = await _step(env, ToolCall("pid", {}))
    assert kind is None, pid
    return int(pid)


async def test_the_server_process_is_gone_after_a_hung_call() -> None:
    env = _env(mcp_tools(stdio_spec(timeout_s=2.0, startup_timeout_s=20.0)))
    await env.reset(options={"task": Task("t", {"prompt": "x"})})
    try:
        pid = await _server_pid(env)
        (hung,) = await _step(env, ToolCall("hang", {}))
        assert hung[1] is ToolErrorKind.TIMEOUT
        assert psutil.pid_exists(pid) and not _zombie(pid)  # still hanging: the episode holds it
    finally:
        await env.close()
    await eventually(lambda: _gone(pid))


async def test_the_server_process_is_gone_after_it_died_mid_episode() -> None:
    env = _env(mcp_tools(stdio_spec(timeout_s=10.0, startup_timeout_s=20.0)))
    await env.reset(options={"task": Task("t", {"prompt": "x"})})
    try:
        pid = await _server_pid(env)
        (died,) = await _step(env, ToolCall("die", {}))
        assert died[1] is ToolErrorKind.TOOL_EXCEPTION and "it may have stopped" in died[0]
    finally:
        await env.close()
    await eventually(lambda: _gone(pid))


async def test_the_server_process_is_gone_after_a_call_is_cancelled() -> None:
    env = _env(mcp_tools(stdio_spec(timeout_s=60.0, startup_timeout_s=20.0)))
    await env.reset(options={"task": Task("t", {"prompt": "x"})})
    try:
        pid = await _server_pid(env)
        server = psutil.Process(pid)
        read = server.io_counters().read_chars
        call = asyncio.ensure_future(_step(env, ToolCall("hang", {})))
        # the call is in flight once the server has read its request
        await eventually(lambda: server.io_counters().read_chars > read)
        call.cancel()  # e.g. the episode's deadline, or the run stopping
        with pytest.raises(asyncio.CancelledError):
            await call
    finally:
        await env.close()
    await eventually(lambda: _gone(pid))


async def test_every_failure_is_a_named_observation(tmp_path: Path) -> None:
    flag = tmp_path / "fail-at-start"
    tools = mcp_tools(stdio_spec(flag, timeout_s=3.0))
    env = _env(tools)
    await env.reset(options={"task": Task("t", {"prompt": "x"})})
    try:
        (bad,) = await _step(env, ToolCall("add", {"a": "two", "b": 2}))
        assert bad[1] is ToolErrorKind.INVALID_ARGUMENTS and "add(a: integer" in bad[0]
        (failed,) = await _step(env, ToolCall("fail", {"message": "no such city"}))
        assert failed[1] is ToolErrorKind.TOOL_EXCEPTION and "no such city" in failed[0]
        (hung,) = await _step(env, ToolCall("hang", {}))
        assert hung == ("Error: tool 'hang' timed out after 3.0s", ToolErrorKind.TIMEOUT)
        assert await _step(env, ToolCall("add", {"a": 1, "b": 1})) == [("2", None)]  # still up
        (died,) = await _step(env, ToolCall("die", {}))
        assert died[1] is ToolErrorKind.TOOL_EXCEPTION and "it may have stopped" in died[0]
        (after,) = await _step(env, ToolCall("add", {"a": 1, "b": 1}))
        assert after[1] is ToolErrorKind.TOOL_EXCEPTION
    finally:
        await env.close()

    flag.touch()  # from now on the server exits at start-up
    await env.reset(options={"task": Task("t", {"prompt": "x"})})
    try:
        (start,) = await _step(env, ToolCall("add", {"a": 1, "b": 1}))
        assert start[1] is ToolErrorKind.TOOL_EXCEPTION and "MCP server" in start[0]
    finally:
        await env.close()


def test_a_server_that_cannot_be_listed_is_a_config_error(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    flag.touch()
    with pytest.raises(ConfigError, match="cannot list the tools of MCP server"):
        mcp_tools(stdio_spec(flag, startup_timeout_s=20.0))
    with pytest.raises(ConfigError, match="has no tools \\['nope'\\]"):
        mcp_tools(stdio_spec(include=("add", "nope")))
    with pytest.raises(ConfigError, match="'mcp:COMMAND ARGS'"):
        parse_tool_spec("python server.py")
    assert parse_tool_spec("mcp:http://127.0.0.1:1/mcp").url == "http://127.0.0.1:1/mcp"
    assert parse_tool_spec("mcp:python 'my server.py'").command == ("python", "my server.py")


def test_tool_spec_options_set_the_limits_and_bad_ones_name_the_fix() -> None:
    spec = parse_tool_spec(
        "mcp[max_concurrency=2, rate_limit_per_s=5,timeout_s=10,startup_timeout_s=40,"
        "include=add+python]:python 'my server.py'"
    )
    assert spec == MCPServerSpec(command=("python", "my server.py"), max_concurrency=2,
                                 rate_limit_per_s=5.0, timeout_s=10.0, startup_timeout_s=40.0,
                                 include=("add", "python"))  # fmt: skip
    assert spec.label == "python 'my server.py'"  # a recording's key ignores the options
    assert (
        parse_tool_spec("mcp[timeout_s=5]:http://127.0.0.1:1/mcp").url == "http://127.0.0.1:1/mcp"
    )
    bad = {
        "mcp[max_concurency=2]:python s.py": r"unknown option 'max_concurency'\. Did you mean "
        r"'max_concurrency'\? The options are max_concurrency, rate_limit_per_s, timeout_s",
        "mcp[max_concurrency=0]:python s.py": r"max_concurrency=0; use an integer >= 1",
        "mcp[max_concurrency=1.5]:python s.py": r"max_concurrency='1\.5' is not an integer",
        "mcp[timeout_s=soon]:python s.py": r"timeout_s='soon' is not a number",
        "mcp[rate_limit_per_s=-1]:python s.py": r"rate_limit_per_s=-1\.0; use a number > 0",
        "mcp[timeout_s]:python s.py": r"option 'timeout_s' needs one value, once: timeout_s=VALUE",
        "mcp[timeout_s=1,timeout_s=2]:python s.py": r"needs one value, once",
        "mcp[timeout_s=1 python s.py": r"no '\]:' ends them; e\.g\. 'mcp\[max_concurrency=2,",
        "mcp[timeout_s=1]:": r"MCP server spec '' is empty",
        "mcp(timeout_s=1):python s.py": r"is not understood.*with options: e\.g\. 'mcp\[",
    }
    for text, message in bad.items():
        with pytest.raises(ConfigError, match=message) as err:
            parse_tool_spec(text)
        assert text in str(err.value)  # every message names the spec it could not read


def _start_http_server(script: Path = SERVER) -> tuple[subprocess.Popen[bytes], str]:
    """The test server (or ``script``, run as ``script http PORT``) over streamable HTTP on a
    free loopback port, listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, str(script), "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        asyncio.run(eventually(lambda: _listening(port), timeout=60.0))
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise
    return proc, f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="module")
def http_server() -> Iterator[str]:
    """The test server over streamable HTTP, for the module."""
    proc, url = _start_http_server()
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def test_http_server_tools_with_limits_shared_across_episodes(http_server: str) -> None:
    tools = mcp_tools(http_server, timeout_s=20.0, max_concurrency=2, rate_limit_per_s=50.0)
    busy = next(t for t in tools if t.name == "busy")
    assert busy.max_concurrency == 2 and busy.rate_limit_per_s == 50.0

    async def episode() -> int:
        env = _env(tools)
        await env.reset(options={"task": Task("t", {"prompt": "x"})})
        try:
            ((content, kind),) = await _step(env, ToolCall("busy", {"seconds": 0.3}))
        finally:
            await env.close()
        assert kind is None
        return int(content)

    peaks = await asyncio.gather(*(episode() for _ in range(5)))
    assert max(peaks) <= 2  # five episodes, each its own session: never more than 2 at once
    env = _env(tools)
    await env.reset(options={"task": Task("t", {"prompt": "x"})})
    try:
        assert await _step(env, ToolCall("add", {"a": 3, "b": 4})) == [("7", None)]
    finally:
        await env.close()


#: An HTTP server whose ``python`` tool (it replaces Calc's: the Calc tool caller calls it) takes
#: a while and answers how many of its calls were in flight at once while it ran.
PEAK_SERVER = """
import asyncio, sys
from mcp.server.mcpserver import MCPServer

server = MCPServer("peak", log_level="WARNING")
active = []


@server.tool()
async def python(code: str) -> str:
    \"\"\"Run Python code and see what it prints.\"\"\"
    mine = [0]
    active.append(mine)
    for call in active:
        call[0] = max(call[0], len(active))
    try:
        await asyncio.sleep(3.0)
    finally:
        active.remove(mine)
    return str(mine[0])


server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
"""


def test_an_mcp_limit_set_in_the_tool_spec_holds_through_agentloop_eval(
    calc_caller_dir: Path, tmp_path: Path
) -> None:
    """``agentloop eval --tools 'mcp[max_concurrency=1]:URL'``: the server never sees two calls
    at once, where the same eval without the option overlaps them."""
    from agentloop.cli import main
    from agentloop.io import read_jsonl

    script = tmp_path / "peak_server.py"
    script.write_text(PEAK_SERVER)
    proc, url = _start_http_server(script)

    def peaks(out: Path, spec: str) -> list[int]:
        args = ["eval", "--env", "agentloop/Calc-v0", "--model", str(calc_caller_dir),
                "--engine", "hf", "--env-arg", "sandbox=remote", "--n", "2", "--num-tasks", "3",
                "--max-turns", "2", "--max-response-len", "96", "--out", str(out), "--quiet",
                "--tools", spec]  # fmt: skip
        assert main(args) == 0
        records = read_jsonl(out / "trajectories.jsonl")
        failed = ("tool_error/tool_exception", "tool_error/timeout")  # in the server or waiting
        assert not [r["metrics"] for r in records if any(k in r["metrics"] for k in failed)]
        answered = [m["content"] for r in records for m in r["messages"] if m["role"] == "tool"]
        answered = [c for c in answered if c.isdigit()]  # not a malformed call's error
        assert len(answered) >= 3, answered
        return [int(c) for c in answered]

    try:
        assert (
            max(peaks(tmp_path / "free", f"mcp[replace=python]:{url}")) >= 2
        )  # episodes overlap their calls
        assert set(
            peaks(tmp_path / "one", f"mcp[max_concurrency=1,timeout_s=60,replace=python]:{url}")
        ) == {1}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    config = json.loads((tmp_path / "one" / "config.json").read_text())
    assert config["tools"] == [f"mcp[max_concurrency=1,timeout_s=60,replace=python]:{url}"]


async def test_an_http_server_stopped_mid_episode_is_a_named_error_not_a_hang() -> None:
    proc, url = await asyncio.to_thread(_start_http_server)
    try:
        env = _env(mcp_tools(url, timeout_s=20.0, startup_timeout_s=20.0))
        await env.reset(options={"task": Task("t", {"prompt": "x"})})
        try:
            assert await _step(env, ToolCall("add", {"a": 1, "b": 2})) == [("3", None)]
            proc.kill()  # the server goes away between two calls of the episode
            await asyncio.to_thread(proc.wait, 30)
            started = time.monotonic()
            ((content, kind),) = await _step(env, ToolCall("add", {"a": 1, "b": 2}))
            assert kind is ToolErrorKind.TOOL_EXCEPTION, (content, kind)
            assert url in content and "it may have stopped" in content
            assert time.monotonic() - started < 20.0  # an error at once, not the call's deadline
        finally:
            await env.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


async def test_a_replay_makes_the_tools_from_the_recorded_schemas_without_the_server(
    tmp_path: Path,
) -> None:
    """eval --tools / data.tools with a recording: the schemas go beside the calls, and a
    replay that runs no tool builds the same tools while the server cannot start."""
    server = tmp_path / "server.py"
    shutil.copy(SERVER, server)
    specs = [f"mcp:{sys.executable} {server}"]
    rec = tmp_path / "rec"
    live = spec_tools(specs, ToolTapeConfig(record=rec))
    assert (rec / SCHEMAS_FILE).is_file()
    (rec / TAPE_FILE).write_text("")  # a recording without calls is still a recording
    server.unlink()  # the server's command is unusable from now on

    replayed = spec_tools(specs, ToolTapeConfig(replay=rec, miss="fail"))
    assert [(t.name, t.description, t.parameters) for t in replayed] == [
        (t.name, t.description, t.parameters) for t in live
    ]
    env = _env(replayed)  # a miss never reaches the server: nothing starts
    await env.reset(options={"task": Task("t", {"prompt": "x"})})
    await env.close()
    with pytest.raises(ConfigError, match="holds no tool schemas of the MCP server"):
        spec_tools([f"mcp:{sys.executable} other.py"], ToolTapeConfig(replay=rec))
    (rec / SCHEMAS_FILE).unlink()
    with pytest.raises(ConfigError, match=r"holds no tool schemas .* it has \[\]"):
        spec_tools(specs, ToolTapeConfig(replay=rec))
