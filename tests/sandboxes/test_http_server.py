"""The servers' shared transport: half-sent requests time out, idle floods don't starve them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from waits import eventually

from agentloop.errors import ConfigError
from agentloop.sandboxes import FakeSandbox
from agentloop.sandboxes.http_limits import HttpLimits, limit_logging
from agentloop.sandboxes.server import SandboxServer, build_parser

pytestmark = pytest.mark.timeout(60)
QUICK = HttpLimits(header_timeout_s=0.5, body_timeout_s=0.5, max_connections=20)


@pytest.fixture
async def served() -> AsyncIterator[tuple[SandboxServer, int]]:
    """The real sandbox server (on the fake backend) with short timeouts and a cap of 20."""
    server = SandboxServer(FakeSandbox(), max_concurrency=4, http=QUICK)
    port = await server.start("127.0.0.1", 0)
    try:
        yield server, port
    finally:
        await server.stop(drain_timeout_s=2)


async def _open(port: int, data: bytes = b"") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if data:
        writer.write(data)
        await writer.drain()
    return reader, writer


async def _run(port: int, code: str = "print(1)") -> int:
    url = f"http://127.0.0.1:{port}/v1/run"
    async with aiohttp.ClientSession() as http, http.post(url, json={"code": code}) as r:
        await r.read()
        return r.status


async def test_a_half_sent_request_head_is_closed_after_the_header_timeout(served: Any) -> None:
    _, port = served
    reader, writer = await _open(port, b"POST /v1/run HTTP/1.1\r\nHost: x\r\nContent-Le")
    silent, _ = await _open(port)  # sends nothing at all
    try:
        # The server closes both: read() returns b"" (EOF) long before the test's deadline.
        assert await asyncio.wait_for(reader.read(), timeout=20) == b""
        assert await asyncio.wait_for(silent.read(), timeout=20) == b""
    finally:
        writer.close()


async def test_a_half_sent_body_gets_408_json_and_the_connection_closes(served: Any) -> None:
    _, port = served
    head = b"POST /v1/run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    reader, writer = await _open(port, head + b'Content-Length: 100\r\n\r\n{"code": ')
    try:
        reply = await asyncio.wait_for(reader.read(), timeout=20)
    finally:
        writer.close()
    status, _, body = reply.partition(b"\r\n")[0], None, reply.split(b"\r\n\r\n", 1)[1]
    assert b" 408 " in status
    assert json.loads(body)["type"] == "Timeout" and "--body-timeout-s" in json.loads(body)["error"]


async def test_normal_requests_succeed_while_50_idle_connections_are_open(served: Any) -> None:
    server, port = served
    idle = [await _open(port, b"GET /health HTTP/1.1\r\n") for _ in range(50)]
    try:
        statuses = await asyncio.gather(*(_run(port) for _ in range(10)))
        assert statuses == [200] * 10
        # The cap (20) held: the oldest half-open connections made room for the new ones.
        assert server._http.connections <= QUICK.max_connections
        assert server._http.evicted >= 50 - QUICK.max_connections
    finally:
        for _, writer in idle:
            writer.close()


async def test_clients_trickling_their_bodies_do_not_starve_normal_requests(served: Any) -> None:
    """Connections whose body never completes are evictable like half-open ones: a cap full
    of them still lets normal requests in (they are not 'busy' until the body is in)."""
    server, port = served
    head = b"POST /v1/run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    slow = [await _open(port, head + b'Content-Length: 100\r\n\r\n{"co') for _ in range(25)]
    try:
        statuses = await asyncio.gather(*(_run(port) for _ in range(10)))
        assert statuses == [200] * 10
        assert server._http.refused == 0 and server._http.evicted >= 25 - QUICK.max_connections
    finally:
        for _, writer in slow:
            writer.close()


async def test_every_connection_busy_at_the_cap_gets_a_503_not_a_hang() -> None:
    slow = SandboxServer(
        FakeSandbox(latency_s=0.5), max_concurrency=4, http=HttpLimits(max_connections=2)
    )
    port = await slow.start("127.0.0.1", 0)
    try:
        busy = [asyncio.create_task(_run(port)) for _ in range(2)]
        await eventually(lambda: slow.gate.active == 2)
        reader, writer = await _open(port)
        reply = await asyncio.wait_for(reader.read(), timeout=20)
        writer.close()
        assert reply.startswith(b"HTTP/1.1 503") and b'"type": "Busy"' in reply
        assert await asyncio.gather(*busy) == [200, 200]  # requests in progress are never cut
    finally:
        await slow.stop(drain_timeout_s=5)


async def test_deeply_nested_json_is_a_json_400(served: Any) -> None:
    _, port = served
    url = f"http://127.0.0.1:{port}/v1/run"
    nested = "[" * 100_000 + "]" * 100_000
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http, http.post(url, data=nested, headers=headers) as r:
        assert r.status == 400 and r.content_type == "application/json"
        assert "nested too deeply" in (await r.json())["error"]


async def test_an_accept_flood_logs_a_bounded_number_of_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What filled 25 MB in 5 s: asyncio logs every failed accept() with a traceback."""
    limit_logging(5)
    loop = asyncio.get_running_loop()
    error = OSError(24, "Too many open files")
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for _ in range(5000):
            loop.call_exception_handler(
                {"message": "socket.accept() out of system resource", "exception": error}
            )
    flood = [r for r in caplog.records if r.name == "asyncio"]
    assert len(flood) == 5
    limit_logging(HttpLimits().log_per_minute)


def test_the_limits_are_operator_flags_with_checked_values() -> None:
    args = build_parser().parse_args(["--header-timeout-s", "3", "--max-connections", "64"])
    assert (args.header_timeout_s, args.max_connections, args.body_timeout_s) == (3.0, 64, 60.0)
    from agentloop.cli import build_parser as cli_parser

    for command in (["serve-search", "--index", "idx"], ["serve-proxy", "--model", "m"]):
        parsed = cli_parser().parse_args([*command, "--max-connections", "9"])
        assert parsed.max_connections == 9 and parsed.header_timeout_s == 15.0
    with pytest.raises(ConfigError, match="--body-timeout-s must be > 0"):
        HttpLimits(body_timeout_s=0)
    with pytest.raises(ConfigError, match="--max-connections must be >= 1"):
        HttpLimits(max_connections=0)


_TRICKLE = (
    b"POST /v1/run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b'Content-Length: 100\r\n\r\n{"co'
)


@pytest.mark.parametrize("racing", [False, True], ids=["quiet", "body-byte-with-the-newcomer"])
async def test_the_cap_closing_a_trickled_body_logs_no_error(
    racing: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """At the cap (1 here) a newcomer replaces a connection trickling its body; the body read
    that the close cuts short is no error of the server's: nothing is logged at WARNING or
    above, no traceback (the proxy logged 25 KB of ``RuntimeError: Connection closed.`` so).
    ``racing``: a byte of body arrives in the same loop pass as the newcomer, so the read
    resumes after the cap's close and before the connection's loss: aiohttp's RuntimeError."""
    server = SandboxServer(FakeSandbox(), http=HttpLimits(max_connections=1))
    port = await server.start("127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    http = server._http
    trickle = socket.create_connection(("127.0.0.1", port))
    newcomer: socket.socket | None = None
    try:
        trickle.sendall(_TRICKLE)
        await eventually(lambda: any(c.reading for c in http._conns.values()))
        with caplog.at_level(logging.DEBUG):
            # blocking calls on loopback: the handshake and the byte are in before the loop
            # looks again, so it sees both in one pass (the newcomer's accept first)
            newcomer = socket.create_connection(("127.0.0.1", port))
            if racing:
                trickle.sendall(b"d")
            trickle.setblocking(False)
            newcomer.setblocking(False)
            await eventually(lambda: http.evicted == 1)
            with contextlib.suppress(ConnectionResetError):
                assert await asyncio.wait_for(loop.sock_recv(trickle, 1024), 10) == b""
            await loop.sock_sendall(newcomer, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = await asyncio.wait_for(loop.sock_recv(newcomer, 4096), 10)
            assert reply.startswith(b"HTTP/1.1 200"), reply
        loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
        assert loud == [], [(r.name, r.getMessage(), r.exc_info) for r in loud]
    finally:
        trickle.close()
        if newcomer is not None:
            newcomer.close()
        await server.stop(drain_timeout_s=2)


def test_only_a_lost_connection_ends_a_body_read_quietly() -> None:
    """The transport swallows aiohttp's "Connection closed." and resets; any other
    RuntimeError of a body read is a bug to log, not a client that left."""
    from agentloop.sandboxes.http_server import _closed_mid_body

    assert _closed_mid_body(ConnectionResetError("Connection lost"))
    assert _closed_mid_body(RuntimeError("Connection closed."))
    busy = "readany() called while another coroutine is already waiting for incoming data"
    assert not _closed_mid_body(RuntimeError(busy))
    assert not _closed_mid_body(RuntimeError("Session is closed"))
