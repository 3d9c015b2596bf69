"""Remote sandbox pools: settings from config, start-up checks, spreading by load, dead servers."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentloop.envs import make
from agentloop.errors import ConfigError, SandboxError
from agentloop.sandboxes import FakeSandbox, SandboxSpec, sandbox_spec
from agentloop.sandboxes.remote_pool import RemotePool, pool_stats
from agentloop.sandboxes.server import SandboxServer
from agentloop.sandboxes.shared import shared_sandbox
from agentloop.tools import Toolset
from agentloop.tools.code_interpreter import code_interpreter_tool
from agentloop.types import ToolCall

TOKEN = "pool-t0ken"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Servers:
    """Sandbox servers on loopback (FakeSandbox behind them: the pool is what is tested)."""

    def __init__(self) -> None:
        self.servers: list[SandboxServer] = []
        self.urls: list[str] = []

    async def add(self, token: str = TOKEN) -> str:
        server = SandboxServer(FakeSandbox(), max_concurrency=4, token=token)
        port = await server.start("127.0.0.1", 0)
        self.servers.append(server)
        self.urls.append(f"http://127.0.0.1:{port}")
        return self.urls[-1]

    async def kill(self, i: int) -> None:
        await self.servers[i].stop(drain_timeout_s=0)


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    s = Servers()
    yield s
    for server in s.servers:
        await server.stop(drain_timeout_s=0)


def test_sandbox_settings_from_config() -> None:
    assert sandbox_spec("local") == SandboxSpec("local")
    assert sandbox_spec("http://a:1,http://b:2") == SandboxSpec(
        "remote", (("urls", ("http://a:1", "http://b:2")),)
    )
    from_yaml = {"backend": "remote", "urls": ["http://a:1"], "token_env": "T"}
    from_cli = json.dumps(from_yaml)  # --env-arg sandbox='{...}'
    assert sandbox_spec(from_yaml) == sandbox_spec(from_cli)
    assert hash(sandbox_spec(from_yaml))  # one shared sandbox per setting
    fake = sandbox_spec({"backend": "fake", "limits": {"timeout_s": 3}}).build()
    assert fake.limits.timeout_s == 3  # limits from YAML become SandboxLimits
    with pytest.raises(ConfigError, match="unknown sandbox backend 'remtoe'"):
        sandbox_spec("remtoe")
    with pytest.raises(ConfigError, match="need 'backend'"):
        sandbox_spec({"urls": ["http://a:1"]})
    with pytest.raises(ConfigError, match=r"urls must be http\(s\) base URLs"):
        RemotePool(["10.0.0.5:8080"])
    with pytest.raises(ConfigError, match=r"\$MISSING_TOKEN is not set"):
        RemotePool("http://a:1", token_env="MISSING_TOKEN")


def test_urls_and_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLOOP_SANDBOX_URLS", "http://a:1, http://b:2")
    monkeypatch.setenv("MY_TOKEN", "s3cret")
    pool = RemotePool(token_env="MY_TOKEN")
    assert pool.urls == ("http://a:1", "http://b:2") and pool.token == "s3cret"
    assert "s3cret" not in pool.token_source  # messages name the variable, never the token


async def test_start_up_names_the_server_that_does_not_answer(servers: Servers) -> None:
    good = await servers.add()
    dead = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(ConfigError, match=f"sandbox server {dead} does not answer"):
        async with RemotePool([good, dead], token=TOKEN, retries=0):
            pass


async def test_start_up_names_the_server_that_rejects_the_token(servers: Servers) -> None:
    good = await servers.add()
    other = await servers.add(token="another")
    with pytest.raises(ConfigError, match=f"sandbox server {other} rejected the token"):
        async with RemotePool([good, other], token=TOKEN):
            pass


async def test_an_env_config_with_a_bad_pool_fails_at_preflight(servers: Servers) -> None:
    """What `agentloop eval`/`train` run before the first episode: not a tool error later."""
    good = await servers.add()
    dead = f"http://127.0.0.1:{_free_port()}"
    env = make("agentloop/Calc-v0", sandbox={"backend": "remote", "urls": [good, dead],
                                             "retries": 0})  # fmt: skip
    with pytest.raises(ConfigError, match=f"sandbox server {dead} does not answer"):
        await env.preflight()


async def test_sessions_spread_by_load_and_stay_on_their_server(servers: Servers) -> None:
    urls = [await servers.add(), await servers.add()]
    async with RemotePool(urls, token=TOKEN) as pool:
        async with pool.session() as a, pool.session() as b, pool.session() as c:
            assert {a.server, b.server} == set(urls)  # the second goes to the idle server
            assert c.server in urls  # a tie: either (ties are taken in turn)
            await a.run("x = 1")
            await b.run("x = 2")
            assert (await a.run("print(x)")).stdout == "1\n"  # state stays on its server
            assert (await b.run("print(x)")).stdout == "2\n"
            stats = pool.stats()
            assert sorted(s.active_sessions for s in stats.servers) == [1, 2]
        stats = pool.stats()
        assert stats.active_sessions == 0 and stats.sessions_opened == 3
        assert stats.runs == 4 and stats.errors == 0 and stats.servers_up == 2


async def test_a_dead_server_fails_its_sessions_by_name_and_new_ones_go_elsewhere(
    servers: Servers,
) -> None:
    urls = [await servers.add(), await servers.add()]
    tool = code_interpreter_tool(
        {"backend": "remote", "urls": urls, "token_env": "POOL_TOKEN", "retries": 1,
         "backoff_s": 0.01, "recheck_s": 3600},
        name="python",
    )  # fmt: skip
    tools = Toolset([tool])
    call = ToolCall("python", {"code": "print(6 * 7)"}, id="c1")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POOL_TOKEN", TOKEN)
        assert tool.preflight is not None
        await tool.preflight()
    async with tools.session() as first, tools.session() as second:
        assert [r.content for r in await first.dispatch([call])] == ["42"]
        assert [r.content for r in await second.dispatch([call])] == ["42"]
        (pool,) = [p for p in pool_stats() if p.sessions_opened == 2]
        assert [s.active_sessions for s in pool.servers] == [1, 1]
        await servers.kill(0)
        (lost,) = await first.dispatch([call])  # its session lived on the dead server
        assert lost.error_kind is not None and urls[0] in lost.content, lost
        (kept,) = await second.dispatch([call])  # the other server's session goes on
        assert kept.content == "42" and kept.error_kind is None
        async with tools.session() as third:  # a new session goes to the live server
            assert [r.content for r in await third.dispatch([call])] == ["42"]
    box: Any = await shared_sandbox(tool_sandbox_spec(urls))
    stats = box.stats()
    assert [s.up for s in stats.servers] == [False, True]
    assert stats.servers[0].errors >= 1 and stats.servers[1].sessions_opened == 2
    assert stats.metrics()["sandbox/servers_up"] == 1.0


def tool_sandbox_spec(urls: list[str]) -> SandboxSpec:
    return sandbox_spec(
        {"backend": "remote", "urls": urls, "token_env": "POOL_TOKEN", "retries": 1,
         "backoff_s": 0.01, "recheck_s": 3600}
    )  # fmt: skip


async def test_a_restarted_server_is_used_again_when_none_is_up(servers: Servers) -> None:
    url = await servers.add()
    async with RemotePool(url, token=TOKEN, retries=0, recheck_s=0.001) as pool:
        await servers.kill(0)
        with pytest.raises(SandboxError, match=url):
            await pool.run("print(1)")
        assert pool.stats().servers_up == 0
        port = int(url.rsplit(":", 1)[1])
        again = SandboxServer(FakeSandbox(), max_concurrency=4, token=TOKEN)
        await again.start("127.0.0.1", port)
        servers.servers.append(again)
        assert (await pool.run("print(1)")).stdout == "1\n"
        assert pool.stats().servers_up == 1
