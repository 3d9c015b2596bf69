"""The remote sandbox client and pool against hostile or busy servers (issue 39): answers read
only up to the client's own output limit, field types checked, ties spread, sessions over a
server's per-client cap wait (bounded) instead of failing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from agentloop.errors import SandboxError
from agentloop.sandboxes import FakeSandbox, SandboxLimits
from agentloop.sandboxes.remote_pool import RemotePool
from agentloop.sandboxes.server import SandboxServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
TOKEN = "t0ken"
GOOD = {"stdout": "ok", "stderr": "", "exit_code": 0, "timed_out": False, "oom_killed": False}
GOOD |= {"duration_s": 0.0, "truncated": False}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _site(run: Handler, session: Handler | None = None) -> tuple[web.AppRunner, str]:
    """A server that passes the pool's start-up check and answers runs with ``run``."""

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def delete(_: web.Request) -> web.Response:
        return web.json_response({"error": "no such session"}, status=404)

    app = web.Application(client_max_size=1 << 30)
    app.router.add_get("/health", health)
    app.router.add_delete("/v1/sessions/{sid}", delete)
    app.router.add_post("/v1/run", run)
    if session is not None:
        app.router.add_post("/v1/sessions", session)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def servers() -> AsyncIterator[list[SandboxServer]]:
    started: list[SandboxServer] = []
    yield started
    for server in started:
        await server.stop(drain_timeout_s=0)


async def _sandbox_server(started: list[SandboxServer], **kwargs: Any) -> str:
    server = SandboxServer(FakeSandbox(), token=TOKEN, **kwargs)
    started.append(server)
    return f"http://127.0.0.1:{await server.start()}"


async def test_a_huge_answer_is_refused_unread_and_wrong_types_are_named() -> None:
    """A 40 MB answer to a client whose output limit is 64 KB is refused (it used to be read
    whole: +425 MB for 200 MB), with and without a Content-Length; a string exit code, a number
    for a flag, a session id that is an object are each a SandboxError naming the field."""
    answers: list[Any] = []

    async def run(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["max_output_bytes"] == 64 << 10  # the client's limit travels with the run
        answer = answers.pop(0)
        if answer == "chunked":  # no Content-Length: the cap holds on the stream itself
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            await resp.write(b'{"stdout": "')
            for _ in range(40):
                await resp.write(b"z" * (1 << 20))
            return resp
        return web.json_response(answer)

    async def session(_: web.Request) -> web.Response:
        return web.json_response({"session_id": {"evil": True}})

    runner, url = await _site(run, session)
    limits = SandboxLimits(timeout_s=5, max_output_bytes=64 << 10)
    try:
        async with RemotePool(url, token=TOKEN, limits=limits, grace_s=10) as pool:
            answers[:] = [GOOD | {"stdout": "z" * (40 << 20)}, "chunked"]
            for _ in range(2):
                with pytest.raises(SandboxError, match="over this client's limit of 851968 bytes"):
                    await pool.run("print(1)")
            answers[:] = [GOOD | {"exit_code": "zero", "truncated": 1, "duration_s": "fast"}]
            with pytest.raises(SandboxError, match=r"exit_code='zero'.*duration_s=.*truncated=1"):
                await pool.run("print(1)")
            answers[:] = [GOOD | {"stdout": "é" * (40 << 10)}]  # 80 KB: fits the answer cap
            result = await pool.run("print(1)")  # but not the output limit: cut to it
            assert len(result.stdout.encode()) == 64 << 10 and result.truncated
            with pytest.raises(SandboxError, match=r"session_id=\{'evil': True\}"):
                async with pool.session():
                    pass
    finally:
        await runner.cleanup()


async def test_ties_are_spread_over_the_servers(servers: list[SandboxServer]) -> None:
    """One session at a time, or several opened at once, no longer all land on server 0."""
    urls = [await _sandbox_server(servers), await _sandbox_server(servers)]
    async with RemotePool(urls, token=TOKEN) as pool:
        one_at_a_time = []
        for _ in range(4):
            async with pool.session() as s:
                one_at_a_time.append(s.server)
        assert sorted(one_at_a_time) == sorted(urls * 2), one_at_a_time

        async def hold(gate: asyncio.Event) -> str:
            async with pool.session() as s:
                await gate.wait()
                return s.server

        gate = asyncio.Event()
        tasks = [asyncio.ensure_future(hold(gate)) for _ in range(4)]
        await _until(lambda: pool.stats().active_sessions == 4)
        gate.set()
        assert sorted(await asyncio.gather(*tasks)) == sorted(urls * 2)


async def _until(condition: Callable[[], bool], deadline_s: float = 30.0) -> None:
    async with asyncio.timeout(deadline_s):
        while not condition():
            await asyncio.sleep(0.02)


async def test_a_session_over_the_per_client_cap_waits_for_one_to_close(
    servers: list[SandboxServer], caplog: pytest.LogCaptureFixture
) -> None:
    """The 3rd session against a server that allows 2 per client waits (it used to fail with
    429), with a warning that says why, and opens once one of the two closes; a second pool on
    the same token, which the first one's count cannot see, is answered 429 and waits too; past
    ``session_wait_s`` the error names the limit."""
    url = await _sandbox_server(servers, max_sessions_per_client=2)
    caplog.set_level(logging.WARNING, logger="agentloop.sandboxes.remote_pool")
    async with (
        RemotePool(url, token=TOKEN, retries=0) as pool,
        RemotePool(url, token=TOKEN, retries=0) as other,
    ):
        assert pool.stats().servers[0].session_cap == 2
        first, second = pool.session(), pool.session()
        a, _ = await first.__aenter__(), await second.__aenter__()
        third = asyncio.ensure_future(_open_and_run(pool))
        await _until(lambda: pool.stats().sessions_waiting == 1)
        assert "at its session limit for this client" in caplog.text
        elsewhere = asyncio.ensure_future(_open_and_run(other))  # 429: counted elsewhere
        await _until(lambda: other.stats().sessions_waiting == 1)
        assert "429" in (other.stats().servers[0].last_error or "")
        assert not third.done() and not elsewhere.done()
        await a.run("x = 1")
        await first.__aexit__(None, None, None)
        assert await asyncio.wait_for(third, 30) == "42\n"
        await second.__aexit__(None, None, None)
        assert await asyncio.wait_for(elsewhere, 30) == "42\n"
        assert pool.stats().errors == 0
    async with (
        RemotePool(url, token=TOKEN, session_wait_s=0.3) as pool,
        pool.session(),
        pool.session(),
    ):
        with pytest.raises(SandboxError, match=r"within session_wait_s=0.3s .*2 open of 2"):
            await _open_and_run(pool)


async def _open_and_run(pool: RemotePool) -> str:
    async with pool.session() as s:
        return (await s.run("print(6 * 7)")).stdout
