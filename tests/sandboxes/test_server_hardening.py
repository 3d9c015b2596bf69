"""Sandbox server hardening (issue 21): limits are ceilings, sessions belong to their client,
tokens stay off the command line, an open bind is loud, SandboxFusion options are honoured."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sbx_helpers import needs_bwrap

from agentloop.sandboxes import FakeSandbox, SandboxLimits, make_sandbox
from agentloop.sandboxes.server import (
    SandboxServer,
    backend_kwargs_from_args,
    build_parser,
    run_from_args,
    serve,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
CEILING = SandboxLimits(timeout_s=1.5, memory_mb=256, max_processes=32, disk_mb=64)
ROOMY = dataclasses.replace(CEILING, timeout_s=20)  # for runs that fill 100 MB on a busy host


async def call(method: str, url: str, body: Any = None, token: str | None = "a") -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url, json=body, headers=headers) as r,
    ):
        return r.status, await r.json(content_type=None)


@pytest.fixture
async def local_server() -> AsyncIterator[str]:
    async with make_sandbox("local", limits=CEILING, pool_size=1) as sb:
        server = SandboxServer(sb, token="a")
        port = await server.start()
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            await server.stop(drain_timeout_s=5)


@needs_bwrap
async def test_a_request_cannot_lift_the_servers_time_limit(local_server: str) -> None:
    """``timeout_s: 1e6`` is cut to the server's 1.5 s (it used to hold the slot for ever)."""
    spin = {"code": "while True:\n    pass\n", "timeout_s": 1e6}
    async with asyncio.timeout(30):
        status, body = await call("POST", local_server + "/v1/run", spin)
        assert status == 200 and body["timed_out"], body
        assert "timed out after 1.5s" in body["stderr"]
        _, opened = await call("POST", local_server + "/v1/sessions", {})
        sid = opened["session_id"]
        status, body = await call("POST", f"{local_server}/v1/sessions/{sid}/run", spin)
        assert status == 200 and body["timed_out"] and "after 1.5s" in body["stderr"], body
        fusion = {"code": spin["code"], "run_timeout": 1e6}
        _, body = await call("POST", local_server + "/run_code", fusion)
        assert body["run_result"]["status"] == "TimeLimitExceeded", body
    # a shorter limit than the ceiling is kept
    status, body = await call("POST", local_server + "/v1/run", {**spin, "timeout_s": 0.5})
    assert body["timed_out"] and "after 0.5s" in body["stderr"], body


async def test_sessions_belong_to_the_client_that_opened_them() -> None:
    server = SandboxServer(FakeSandbox(), token=["a", "b"], max_sessions_per_client=2)
    url = f"http://127.0.0.1:{await server.start()}"
    try:
        _, opened = await call("POST", url + "/v1/sessions", {}, token="a")
        sid = opened["session_id"]
        run = f"{url}/v1/sessions/{sid}/run"
        assert (await call("POST", run, {"code": "x = 1"}, token="a"))[0] == 200
        status, body = await call("POST", run, {"code": "print(x)"}, token="b")
        assert status == 404 and body["type"] == "NoSession", body
        assert (await call("DELETE", f"{url}/v1/sessions/{sid}", token="b"))[0] == 404
        assert sid in server.sessions  # b could neither use nor close it
        # at most 2 sessions per client; the other client is not affected
        assert (await call("POST", url + "/v1/sessions", {}, token="a"))[0] == 200
        status, body = await call("POST", url + "/v1/sessions", {}, token="a")
        assert status == 429 and "--max-sessions-per-client 2" in body["error"], body
        assert (await call("POST", url + "/v1/sessions", {}, token="b"))[0] == 200
    finally:
        await server.stop()


def test_the_token_never_comes_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = build_parser().parse_args(["--backend", "fake", "--token", "s3cret"])
    assert run_from_args(args) == 2
    out = capsys.readouterr().out
    assert "`ps`" in out and "--token-file PATH" in out and "AGENTLOOP_SANDBOX_TOKEN" in out
    from agentloop.sandboxes.serve_args import read_tokens

    tokens = tmp_path / "tokens"
    tokens.write_text("alpha\n\nbeta\n")
    assert read_tokens(build_parser().parse_args(["--token-file", str(tokens)])) == [
        "alpha",
        "beta",
    ]
    monkeypatch.setenv("AGENTLOOP_SANDBOX_TOKEN", "gamma")
    assert read_tokens(build_parser().parse_args([])) == ["gamma"]


async def test_an_open_bind_without_auth_warns_loudly(capsys: pytest.CaptureFixture[str]) -> None:
    stop = asyncio.Event()
    task = asyncio.ensure_future(serve(FakeSandbox(), host="0.0.0.0", port=0, stop=stop))
    await asyncio.sleep(0.3)
    stop.set()
    await asyncio.wait_for(task, 10)
    err = capsys.readouterr().err
    assert "WARNING" in err and "NO authentication" in err, err
    task = asyncio.ensure_future(serve(FakeSandbox(), host="127.0.0.1", port=0, stop=stop))
    await asyncio.wait_for(task, 10)
    assert "WARNING" not in capsys.readouterr().err


@needs_bwrap
async def test_sandboxfusion_fetch_files_and_memory_limit(local_server: str) -> None:
    url = local_server + "/auth/a/run_code"
    write = "open('out.txt', 'w').write('forty-two')\nimport os; os.makedirs('d')\n"
    write += "open('d/b.bin', 'wb').write(bytes(range(4)))\n"
    body = {"code": write, "fetch_files": ["out.txt", "d/b.bin", "missing.txt"]}
    status, res = await call("POST", url, body, token=None)
    assert status == 200 and res["status"] == "Success", res
    files = {k: base64.b64decode(v) for k, v in res["files"].items()}
    assert files == {"out.txt": b"forty-two", "d/b.bin": bytes(range(4))}
    # memory_limit_MB at or above the server's 256 MB (or -1) runs under 256 MB
    for ok in (256, 4096, -1):
        _, res = await call("POST", url, {"code": "print(1)", "memory_limit_MB": ok}, token=None)
        assert res["status"] == "Success", res
    # a lower one needs a server that can build a sandbox with it (serve() gives it a factory)
    status, res = await call("POST", url, {"code": "1", "memory_limit_MB": 64}, token=None)
    assert status == 400 and "64 MB is below this server's 256 MB" in res["error"], res
    status, res = await call(
        "POST", url, {"code": "ls", "language": "bash", "fetch_files": ["x"]}, token=None
    )
    assert status == 400 and "fetch_files" in res["error"], res


@pytest.fixture
async def tightening_server() -> AsyncIterator[tuple[str, SandboxServer]]:
    """A local server with the factory `serve` gives it: it can lower memory per request."""
    async with make_sandbox("local", limits=ROOMY, pool_size=0) as sb:

        def factory(limits: SandboxLimits) -> Any:
            return make_sandbox("local", limits=limits, pool_size=0)

        server = SandboxServer(sb, token="a", factory=factory)
        port = await server.start()
        try:
            yield f"http://127.0.0.1:{port}", server
        finally:
            await server.stop(drain_timeout_s=5)


@needs_bwrap
async def test_a_client_may_tighten_every_limit_and_a_looser_one_is_clamped(
    tightening_server: tuple[str, SandboxServer],
) -> None:
    """Issue 41: memory, output and time below the server's apply to that run; above it they
    are clamped to the server's (SandboxFusion's semantics); what is not a limit is a 400."""
    url, server = tightening_server
    grab = "x = bytearray(100 << 20); x[::4096] = b'1' * len(x[::4096]); print('held 100 MB')"
    fusion = url + "/auth/a/run_code"
    _, res = await call("POST", fusion, {"code": grab, "memory_limit_MB": 64}, token=None)
    assert res["status"] == "Failed" and "held" not in res["run_result"]["stdout"], res
    for looser in (256, 100_000, -1):  # at, above (clamped to 256 MB) and SandboxFusion's none
        _, res = await call("POST", fusion, {"code": grab, "memory_limit_MB": looser}, token=None)
        assert res["run_result"]["stdout"] == "held 100 MB\n", (looser, res)
    assert server.tiers.limits == (64,)  # one extra sandbox, for the one lower limit asked
    status, body = await call("POST", url + "/v1/run", {"code": grab, "memory_mb": 64})
    assert status == 200 and body["exit_code"] != 0, body
    out = {"code": "print('x' * 5000)", "max_output_bytes": 100}
    status, body = await call("POST", url + "/v1/run", out)
    assert body["stdout"] == "x" * 100 and body["truncated"], body
    status, body = await call("POST", url + "/v1/run", out | {"max_output_bytes": 1e12})
    assert body["stdout"] == "x" * 5000 + "\n" and not body["truncated"], body
    slow = {"code": "import time; time.sleep(5)", "timeout_s": 0.5}
    status, body = await call("POST", url + "/v1/run", slow)
    assert body["timed_out"] and "after 0.5s" in body["stderr"], body
    for field, bad in [
        ("memory_mb", "64"), ("memory_mb", True), ("memory_mb", 0), ("memory_mb", -5),
        ("memory_mb", 16), ("max_output_bytes", -1), ("timeout_s", "5"), ("timeout_s", -1),
    ]:  # fmt: skip
        status, body = await call("POST", url + "/v1/run", {"code": "1", field: bad})
        assert status == 400 and field in body["error"], (field, bad, body)
    for bad in ("1024", False, 0, -2):
        status, body = await call("POST", fusion, {"code": "1", "memory_limit_MB": bad}, None)
        assert status == 400 and "memory_limit_MB" in body["error"], (bad, body)
    async with aiohttp.ClientSession() as http:  # NaN is not a limit (json reads it)
        raw = b'{"code": "1", "memory_limit_MB": NaN}'
        async with http.post(fusion, data=raw) as r:
            assert r.status == 400 and "memory_limit_MB" in (await r.json())["error"]


async def test_a_lone_surrogate_in_code_is_a_400_not_a_500() -> None:
    """Issue 39 (N10): it was an InternalError (UnicodeEncodeError) from the backend."""
    server = SandboxServer(FakeSandbox(), token="a")
    url = f"http://127.0.0.1:{await server.start()}"
    try:
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer a"}) as http:
            for path, raw in [
                ("/v1/run", b'{"code": "print(\'\\ud800\')"}'),
                ("/v1/run", b'{"code": "1", "stdin": "\\udfff"}'),
                ("/auth/a/run_code", b'{"code": "print(\'\\ud800\')"}'),
            ]:
                async with http.post(url + path, data=raw) as r:
                    body = await r.json()
                    assert r.status == 400 and "lone surrogate" in body["error"], body
    finally:
        await server.stop(drain_timeout_s=0)


def test_serve_sandbox_help_lists_the_ceilings() -> None:
    text = build_parser().format_help()
    for flag in ("--token-file", "--cpu-time-s", "--max-output-bytes", "--max-sessions-per-client"):
        assert flag in text
    assert "--token " not in text  # the command-line token is not offered
    argv = ["--timeout-s", "5", "--cpu-time-s", "2", "--memory-mb", "512", "--disk-mb", "32"]
    argv += ["--max-output-bytes", "4096"]
    limits = backend_kwargs_from_args(build_parser().parse_args(argv))["limits"]
    assert (limits.timeout_s, limits.cpu_time_s, limits.memory_mb) == (5, 2, 512)
    assert (limits.disk_mb, limits.max_output_bytes) == (32, 4096)


async def test_a_burst_of_opens_while_every_slot_is_busy_keeps_the_session_caps() -> None:
    """Issue 21 (items 1, 15): the caps are counted when an open arrives, not after it waited
    for a run slot, so 6 concurrent opens while the only slot is busy give 2 sessions (the
    per-client cap); and across clients the server-wide cap holds the same way."""
    server = SandboxServer(
        FakeSandbox(latency_s=0.5),
        token=["a", "b"],
        max_concurrency=1,
        max_queue=16,
        max_sessions=3,
        max_sessions_per_client=2,
    )
    url = f"http://127.0.0.1:{await server.start()}"
    try:
        busy = asyncio.ensure_future(call("POST", url + "/v1/run", {"code": "pass"}))
        await asyncio.sleep(0.1)  # the one run slot is taken: every open below waits for it
        a = [asyncio.ensure_future(call("POST", url + "/v1/sessions", {})) for _ in range(4)]
        await asyncio.sleep(0.1)
        b = [call("POST", url + "/v1/sessions", {}, token="b") for _ in range(2)]
        answers_b = await asyncio.gather(*b)
        answers_a = await asyncio.gather(*a)
        await busy
        assert sorted(s for s, _ in answers_a) == [200, 200, 429, 429], answers_a
        assert sorted(s for s, _ in answers_b) == [200, 429], answers_b  # 3 at most in all
        assert len(server.sessions) == 3
    finally:
        await server.stop()


async def test_the_session_behind_fetch_files_counts_against_the_caps() -> None:
    """SandboxFusion's ``fetch_files`` opens a session for the run and its read-back: it is
    one of the client's sessions while it lives (and refused when the client is at its cap)."""
    server = SandboxServer(FakeSandbox(latency_s=0.5), token="a", max_sessions_per_client=1)
    url = f"http://127.0.0.1:{await server.start()}"
    fusion = {"code": "pass", "fetch_files": ["out.txt"]}
    try:
        fetching = asyncio.ensure_future(call("POST", url + "/auth/a/run_code", fusion, None))
        await asyncio.sleep(0.2)
        status, body = await call("POST", url + "/v1/sessions", {})
        assert status == 429 and "--max-sessions-per-client 1" in body["error"], body
        status, body = await fetching
        assert status == 200 and body["status"] == "Success", body
        _, opened = await call("POST", url + "/v1/sessions", {})
        status, body = await call("POST", url + "/auth/a/run_code", fusion, None)
        assert status == 429 and body["type"] == "TooManySessions", body
        await call("DELETE", f"{url}/v1/sessions/{opened['session_id']}")
        assert (await call("POST", url + "/auth/a/run_code", fusion, None))[0] == 200
    finally:
        await server.stop()


@needs_bwrap
async def test_fetch_files_after_code_that_replaces_print(local_server: str) -> None:
    """Issue 21 (items 14, 15): the read-back does not go through ``print``, so code that
    replaced ``builtins.print`` still gets its files (it used to be a plain-text 500)."""
    code = "import builtins\nbuiltins.print = lambda *a, **k: None\nopen('o.txt', 'w').write('hi')"
    body = {"code": code, "fetch_files": ["o.txt"]}
    status, res = await call("POST", local_server + "/auth/a/run_code", body, token=None)
    assert status == 200 and res["status"] == "Success", res
    assert base64.b64decode(res["files"]["o.txt"]) == b"hi"


def _garbled_read_back(code: str, namespace: dict[str, Any]) -> str:
    return "not json at all" if "b64encode" in code else ""


async def test_a_garbled_fetch_files_read_back_is_a_clear_json_error() -> None:
    server = SandboxServer(FakeSandbox(_garbled_read_back))
    url = f"http://127.0.0.1:{await server.start()}"
    try:
        body = {"code": "pass", "fetch_files": ["o.txt"]}
        async with aiohttp.ClientSession() as http, http.post(url + "/run_code", json=body) as r:
            assert r.content_type == "application/json", await r.text()
            res = await r.json()
        assert res["status"] == "SandboxError", res
        assert "fetch_files could not be read back" in res["message"], res
        assert "'not json at all'" in res["message"] and "JSON object" in res["message"], res
    finally:
        await server.stop()


def _crash(code: str, namespace: dict[str, Any]) -> str:
    raise RuntimeError("a bug in the backend")


async def test_an_unexpected_exception_is_a_json_500_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = SandboxServer(FakeSandbox(_crash))
    url = f"http://127.0.0.1:{await server.start()}"
    try:
        with caplog.at_level(logging.ERROR):
            async with (
                aiohttp.ClientSession() as http,
                http.post(url + "/v1/run", json={"code": "1"}) as r,
            ):
                assert (r.status, r.content_type) == (500, "application/json"), await r.text()
                res = await r.json()
        assert res["type"] == "InternalError" and "RuntimeError" in res["error"], res
        assert "a bug in the backend" not in res["error"]  # details go to the log only
        logged = [r for r in caplog.records if r.exc_info and "a bug" in str(r.exc_info[1])]
        assert len(logged) == 1, caplog.records
    finally:
        await server.stop()
