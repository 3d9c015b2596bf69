"""Sandbox server + remote client: auth, back-pressure, limits, sessions, SandboxFusion, retries."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from sbx_helpers import needs_bwrap

from agentloop.errors import ConfigError, SandboxError
from agentloop.sandboxes import ExecResult, FakeSandbox, make_sandbox
from agentloop.sandboxes.remote import RemoteSandbox
from agentloop.sandboxes.server import SandboxServer, build_parser, serve

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
TOKEN = "s3cret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def served() -> AsyncIterator[tuple[SandboxServer, str]]:
    server = SandboxServer(FakeSandbox(latency_s=0.05), max_concurrency=2, max_queue=1, token=TOKEN)
    port = await server.start("127.0.0.1", 0)
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        await server.stop(drain_timeout_s=2)


async def post(url: str, body: Any, token: str | None = TOKEN) -> tuple[int, Any, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as r:
        return r.status, await r.json(content_type=None), r.headers


async def test_health_is_open_and_everything_else_needs_the_token(served: Any) -> None:
    _, url = served
    async with aiohttp.ClientSession() as http, http.get(url + "/health") as r:
        health = await r.json()
    assert health["status"] == "ok" and health["backend"] == "fake"
    assert health["max_concurrency"] == 2
    status, body, _ = await post(url + "/v1/run", {"code": "print(1)"}, token=None)
    assert status == 401 and "token" in body["error"]
    status, body, _ = await post(url + "/v1/run", {"code": "print(1)"}, token="wrong")
    assert status == 401
    status, body, _ = await post(url + "/v1/run", {"code": "print(1)"})
    assert status == 200 and ExecResult.from_dict(body).stdout == "1\n"


async def test_bad_requests_get_400_and_too_large_gets_413(served: Any) -> None:
    _, url = served
    status, body, _ = await post(url + "/v1/run", {"code": 3})
    assert status == 400 and body["type"] == "ConfigError" and "'code'" in body["error"]
    status, body, _ = await post(url + "/v1/run", {"code": "x", "files": {"../etc": "eA=="}})
    assert status == 400 and "relative" in body["error"]
    small = SandboxServer(FakeSandbox(), max_request_bytes=1024)
    port = await small.start()
    try:
        status, body, _ = await post(f"http://127.0.0.1:{port}/v1/run", {"code": "#" * 5000})
        assert status == 413 and "1024 bytes" in body["error"]
    finally:
        await small.stop()
    async with RemoteSandbox(url, token=TOKEN) as client:
        with pytest.raises(ConfigError, match="must be relative"):
            await client.run("x", files={"/abs": "y"})  # checked before sending


async def test_back_pressure_queues_then_answers_429_with_retry_after(served: Any) -> None:
    _, url = served  # 2 running + 1 queued; the 4th and later are refused
    results = await asyncio.gather(*(post(url + "/v1/run", {"code": "pass"}) for _ in range(6)))
    statuses = sorted(s for s, _, _ in results)
    assert statuses.count(200) >= 3 and 429 in statuses
    refused = next(h for s, _, h in results if s == 429)
    assert refused["Retry-After"] == "1"
    async with RemoteSandbox(url, token=TOKEN, backoff_s=0.05) as client:  # retries 429s
        ok = await asyncio.gather(*(client.run("print(2)") for _ in range(6)))
    assert all(r.stdout == "2\n" for r in ok)


async def test_sandboxfusion_run_code_compatibility(served: Any) -> None:
    _, url = served
    files = {"data.txt": base64.b64encode(b"42").decode()}
    body = {"code": "print(input())", "language": "python"}
    status, res, _ = await post(url + f"/auth/{TOKEN}/run_code", {**body, "stdin": "hi"}, None)
    assert status == 200 and res["status"] == "Success"
    assert res["run_result"]["stdout"] == "hi\n" and res["run_result"]["return_code"] == 0
    assert set(res["run_result"]) == {"status", "execution_time", "return_code", "stdout", "stderr"}
    failed = await post(url + "/run_code", {"code": "raise SystemExit(2)", "files": files})
    assert failed[1]["status"] == "Failed" and failed[1]["run_result"]["return_code"] == 2
    unsupported = await post(url + "/run_code", {"code": "int main(){}", "language": "cpp"})
    assert unsupported[1]["status"] == "SandboxError" and "cpp" in unsupported[1]["message"]
    assert (await post(url + "/run_code", {"code": "1"}, token=None))[0] == 401


async def test_sandboxfusion_timeout_status() -> None:
    fake = FakeSandbox([ExecResult("", "", 137, timed_out=True, duration_s=1.0)])
    server = SandboxServer(fake)
    port = await server.start()
    try:
        _, res, _ = await post(f"http://127.0.0.1:{port}/run_code", {"code": "while 1: pass"})
        assert res["status"] == "Failed"
        assert res["run_result"]["status"] == "TimeLimitExceeded"
        assert res["run_result"]["return_code"] is None
    finally:
        await server.stop()


async def test_sessions_live_on_their_server_and_expire() -> None:
    server = SandboxServer(FakeSandbox(), token=TOKEN, session_ttl_s=0.3)
    url = f"http://127.0.0.1:{await server.start()}"
    async with RemoteSandbox(url, token=TOKEN) as client:
        async with client.session() as s:
            await s.run("x = 5")
            assert (await s.run("print(x)")).stdout == "5\n"
            assert s.id.startswith(server.instance)
        assert server.sessions == {}  # closed on exit
        async with client.session() as s:
            await asyncio.sleep(0.8)  # idle past the TTL: the server closes it
            with pytest.raises(SandboxError, match="does not exist on this server"):
                await s.run("print(1)")
    await server.stop()


async def test_graceful_shutdown_finishes_running_requests() -> None:
    server = SandboxServer(FakeSandbox(latency_s=0.5))
    port = await server.start()
    url = f"http://127.0.0.1:{port}"
    running = asyncio.ensure_future(post(url + "/v1/run", {"code": "print('done')"}))
    await asyncio.sleep(0.1)
    stopping = asyncio.ensure_future(server.stop(drain_timeout_s=5))
    await asyncio.sleep(0.05)
    status, _, _ = await post(url + "/v1/run", {"code": "print(1)"})
    assert status == 503  # draining: no new work
    status, body, _ = await running
    assert status == 200 and body["stdout"] == "done\n"
    await stopping


async def test_client_retries_connection_errors_until_the_server_is_up() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with RemoteSandbox(url, retries=1, backoff_s=0.01) as quick:
        with pytest.raises(SandboxError, match="cannot connect"):
            await quick.run("print(1)")
    async with RemoteSandbox(url, retries=8, backoff_s=0.05) as client:
        server = SandboxServer(FakeSandbox())

        async def start_later() -> None:
            await asyncio.sleep(0.3)
            await server.start("127.0.0.1", port)

        starter = asyncio.ensure_future(start_later())
        try:
            assert (await client.run("print(7)")).stdout == "7\n"
        finally:
            await starter
            await server.stop()


async def test_failover_to_the_next_server_for_one_off_runs(served: Any) -> None:
    _, url = served
    dead = f"http://127.0.0.1:{free_port()}"
    async with RemoteSandbox([dead, url], token=TOKEN, retries=0) as client:
        for _ in range(3):
            assert (await client.run("print(3)")).stdout == "3\n"


async def test_serve_entry_point_and_parser() -> None:
    args = build_parser().parse_args(["--backend", "fake", "--port", "0", "--token-file", "t"])
    assert (args.backend, args.port, args.token_file, args.max_concurrency >= 1) == (
        "fake",
        0,
        "t",
        True,
    )
    stop = asyncio.Event()
    task = asyncio.ensure_future(serve(FakeSandbox(), port=0, stop=stop))
    await asyncio.sleep(0.2)
    stop.set()
    await asyncio.wait_for(task, 10)
    with pytest.raises(ConfigError, match="urls must be http"):
        make_sandbox("remote", urls="localhost:80")


@needs_bwrap
async def test_agentloop_serve_sandbox_command() -> None:
    """The documented command line: ``agentloop serve-sandbox --backend local --port N
    --max-concurrency K`` with the token in ``$AGENTLOOP_SANDBOX_TOKEN``, a real local backend
    behind it, SIGTERM ends it cleanly."""
    argv = [sys.executable, "-m", "agentloop.cli", "serve-sandbox", "--backend", "local"]
    argv += ["--port", "0", "--max-concurrency", "2", "--pool-size", "1"]
    env = {**os.environ, "AGENTLOOP_SANDBOX_TOKEN": TOKEN}
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        url = re.search(r"(http://127\.0\.0\.1:\d+)\s*$", line)
        assert url, line
        async with make_sandbox("remote", urls=url.group(1), token=TOKEN) as sb:
            res = await sb.run("import os; print(os.getcwd(), 6 * 7)")
            assert res.stdout == "/sandbox 42\n", res
        status, body, _ = await post(url.group(1) + "/v1/run", {"code": "1"}, token="wrong")
        assert status == 401, body
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0
