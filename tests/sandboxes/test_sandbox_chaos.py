"""Chaos: a sandbox server killed mid-run, and clients that crash with sandboxes open."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sbx_helpers import needs_bwrap

from agentloop.errors import SandboxError
from agentloop.sandboxes import make_sandbox
from agentloop.sandboxes.cgroups import detect_cgroups
from agentloop.sandboxes.docker import sandbox_containers
from agentloop.tools import Toolset
from agentloop.tools.code_interpreter import code_interpreter_tool
from agentloop.types import ToolCall

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]
LEAK_DEADLINE_S = 60.0


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a live process, None if it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else (int(fields[1]), fields[19])


def descendants(root: int) -> dict[int, str]:
    """Live descendants of ``root``: pid -> start time (so a reused pid is not mistaken)."""
    parents: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))):
            parents[int(name)] = st
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, (ppid, start) in parents.items():
            if ppid == pid and child not in found:
                found[child] = start
                frontier.append(child)
    return found


def wait_dead(procs: dict[int, str], timeout_s: float = LEAK_DEADLINE_S) -> dict[int, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        alive = {p: s for p, s in procs.items() if (st := _stat(p)) and st[1] == s}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def spawn(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True
    )


def wait_line(proc: subprocess.Popen[str], pattern: str, timeout_s: float = 60) -> re.Match[str]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if m := re.search(pattern, line):
            return m
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"child never printed {pattern!r}")


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


SERVER = """
import sys
from agentloop.sandboxes.server import main
sys.exit(main(["--backend", "local", "--port", "{port}", "--pool-size", "1"]))
"""


@needs_bwrap
async def test_killed_server_gives_a_clear_error_and_a_restart_restores_service(
    children: list[subprocess.Popen[str]],
) -> None:
    server = spawn(SERVER.format(port=0))
    children.append(server)
    port = wait_line(server, r":(\d+)\s*$").group(1)
    url = f"http://127.0.0.1:{port}"
    async with make_sandbox("remote", urls=url, retries=2, backoff_s=0.05) as client:
        tools = Toolset([code_interpreter_tool(client, name="python", timeout_s=90)])
        sleep = ToolCall("python", {"code": "import time; time.sleep(60)"}, id="c1")
        async with client.session() as s, tools.session() as episode:
            await s.run("x = 1")
            running = asyncio.ensure_future(s.run("import time; time.sleep(60)", timeout_s=90))
            tool_call = asyncio.ensure_future(episode.dispatch([sleep]))
            await asyncio.sleep(1.5)
            sandboxes = descendants(server.pid)
            assert len(sandboxes) >= 4  # bwrap + kernel processes of both sessions
            started = time.monotonic()
            server.send_signal(signal.SIGKILL)
            with pytest.raises(SandboxError, match="sandbox server"):
                await asyncio.wait_for(running, 15)
            (observation,) = await asyncio.wait_for(tool_call, 15)  # the tool: an observation
            assert time.monotonic() - started < 15  # a clear error, not a hang
            assert observation.error_kind is not None, observation
            assert "sandbox could not run the code" in observation.content, observation
            assert "sandbox server" in observation.content, observation
        assert wait_dead(sandboxes) == {}, "sandboxes outlived their killed server"
        restarted = spawn(SERVER.format(port=port))
        children.append(restarted)
        wait_line(restarted, r":(\d+)\s*$")
        assert (await client.run("print('back')")).stdout == "back\n"
        async with client.session() as s:
            assert (await s.run("print(globals().get('x'))")).stdout == "None\n"
    restarted.send_signal(signal.SIGTERM)  # graceful shutdown closes its sandboxes
    assert restarted.wait(30) == 0


LOCAL_CLIENT = """
import asyncio
from agentloop.sandboxes import make_sandbox
async def main():
    async with make_sandbox("local", pool_size=2) as sb, sb.session() as s:
        await s.run("x = 1")
        await asyncio.sleep(1.0)
        print("READY", flush=True)
        await asyncio.sleep(600)
asyncio.run(main())
"""


@needs_bwrap
async def test_crashed_client_leaves_no_local_sandbox_processes(
    children: list[subprocess.Popen[str]],
) -> None:
    client = spawn(LOCAL_CLIENT)
    children.append(client)
    wait_line(client, "READY")
    sandboxes = descendants(client.pid)
    assert len(sandboxes) >= 4  # the session's and the pool's bwrap + kernels
    client.send_signal(signal.SIGKILL)
    client.wait()
    assert wait_dead(sandboxes) == {}, "sandbox processes outlived their crashed client"
    root = detect_cgroups()
    if root is not None:  # its empty cgroups are reaped by the next sandbox that starts
        async with make_sandbox("local", pool_size=0):
            left = [p for _, d in root.parents for p in d.glob(f"agentloop-{client.pid}-*")]
        assert left == []


DOCKER_CLIENT = """
import asyncio
from agentloop.sandboxes import make_sandbox
async def main():
    async with make_sandbox("docker", base_url={url!r}, pool_size=2) as sb, sb.session() as s:
        await s.run("x = 1")
        await asyncio.sleep(2.0)
        print("READY", flush=True)
        await asyncio.sleep(600)
asyncio.run(main())
"""


async def test_crashed_client_leaves_no_docker_containers(
    podman: Any, children: list[subprocess.Popen[str]]
) -> None:
    client = spawn(DOCKER_CLIENT.format(url=podman.url))
    children.append(client)
    wait_line(client, "READY", timeout_s=120)
    engine = podman.client()
    owner = f"{os.uname().nodename}:{client.pid}"

    def containers() -> list[str]:
        return [cid for cid, labels in sandbox_containers(engine)
                if labels.get("agentloop.owner") == owner]  # fmt: skip

    assert len(containers()) >= 2
    client.send_signal(signal.SIGKILL)
    client.wait()
    deadline = time.monotonic() + LEAK_DEADLINE_S
    while containers() and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    assert containers() == [], "containers outlived their crashed client"
