"""The proxy's ceilings on loopback with a scripted engine: huge bodies refused without stalling
the loop (a heartbeat measures it), in serve-proxy and in training; tokens and episode
ownership; server-drawn ids; the episode lifetime and cap; malformed fields as OpenAI 4xx."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from typing import Any

import aiohttp
import openai
import pytest
from proxy_lag import loop_lag

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.base import SamplingParams
from agentloop.engines.fake import FakeEngine
from agentloop.envs.agent_env import AgentEnv
from agentloop.proxy import AgentProxy, EpisodeLimits
from agentloop.proxy.guard import ServerLimits
from agentloop.rollout import RolloutConfig
from agentloop.types import StopReason, Task

FETCH = [{"type": "function", "function": {"name": "fetch", "description": "Fetch a page.",
          "parameters": {"type": "object", "properties": {}}}}]  # fmt: skip
CALL = '<tool_call>\n{"name": "fetch", "arguments": {}}\n</tool_call>'


def _engine(tokenizer: Any, replies: Any = None) -> FakeEngine:
    def script(prompt_ids: list[int], sampling: SamplingParams) -> str:
        return r"\boxed{1}" if "<tool_response>" in tokenizer.decode(prompt_ids[-400:]) else CALL

    return FakeEngine(replies or script, tokenizer=tokenizer,
                      eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))  # fmt: skip


def _chat(content: str = "hi", **kw: Any) -> dict[str, Any]:
    return {"model": "agentloop", "messages": [{"role": "user", "content": content}], **kw}


async def _post(url: str, body: bytes | dict[str, Any], key: str = "ep") -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as s, s.post(url, data=data, headers=headers) as r:
        assert r.content_type == "application/json", await r.text()
        return r.status, await r.json()


def _blocking_post(port: int, body: bytes) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": "Bearer ep", "Content-Type": "application/json"}
    try:
        conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@pytest.mark.parametrize(("mb", "status"), [(64, 413), (7, 400)])
async def test_a_huge_request_is_refused_within_a_second_and_the_loop_keeps_beating(
    tokenizer: Any, mb: int, status: int
) -> None:
    """64 MB is over the body limit (413, unread); 7 MB is under it but cannot fit the context:
    a 400 from the size check, without tokenizing (before: 8 MB took 7.7 s and stalled every
    episode as long). The client runs on a thread of its own: the heartbeat times the proxy."""
    body = json.dumps(_chat("word " * (mb * 2**20 // 5))).encode()
    engine = _engine(tokenizer)
    async with AgentProxy(engine, TokenBuilder(tokenizer), open_episodes=True) as proxy:
        async with loop_lag() as lag:
            t0 = time.perf_counter()
            got, answer = await asyncio.to_thread(_blocking_post, proxy.port, body)
            took = time.perf_counter() - t0
        assert got == status, answer
        assert answer["error"]["code"] == ("request_too_large" if status == 413
                                           else "context_length_exceeded")  # fmt: skip
        assert took < 1.0 and lag.worst_s < 0.2, (took, lag.worst_s)
        assert not engine.requests
        if status == 400:  # parsed: the episode opened, refused before the engine (no turn)
            assert proxy.episodes["ep"].requests == 0
            assert proxy.episodes["ep"].limit_hit is StopReason.CONTEXT_OVERFLOW
        else:  # refused unread: no episode was opened
            assert "ep" not in proxy.episodes
        ok, _ = await _post(proxy.url + "/chat/completions", _chat(), key="other")
        assert ok == 200  # the proxy serves on


async def test_a_10_mb_tool_message_in_training_is_refused_and_siblings_finish(
    tokenizer: Any,
) -> None:
    """Six AgentEnv episodes share the in-process proxy; t1's agent sends a 10 MB page back as
    a tool message. It ends with a context overflow (its turn before is kept), the other five
    finish, and the loop never stalls (before: 9.3 s)."""
    page = "word " * (10 * 2**20 // 5)

    async def agent(task: Task, client: Any) -> str | None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.data["prompt"]}]
        for _ in range(3):
            reply = await client.chat.completions.create(
                model="agentloop", messages=messages, tools=FETCH
            )
            m = reply.choices[0].message
            messages.append(m.model_dump(exclude_none=True))
            if not m.tool_calls:
                return str(m.content)
            for c in m.tool_calls:
                content = page if task.id == "t1" else "a short page"
                messages.append({"role": "tool", "tool_call_id": c.id, "content": content})
        return None

    def env() -> AgentEnv:
        return AgentEnv(agent, reward=lambda task, answer: float(answer == r"\boxed{1}"))

    engine, builder = _engine(tokenizer), TokenBuilder(tokenizer)
    config = RolloutConfig(max_turns=4, timeout_s=60)
    warm = [Task("w", {"prompt": "q", "answer": "1"})]  # imports and first calls: not measured
    await collect(warm, env, engine, builder, config=config)
    tasks = [Task(f"t{i}", {"prompt": f"q {i}", "answer": "1"}) for i in range(6)]
    async with loop_lag() as lag:
        groups = await collect(tasks, env, engine, builder, config=config, concurrency=6)
    trajs = {g.task.id: g.trajectories[0] for g in groups}
    assert lag.worst_s < 0.2, lag.worst_s
    t1 = trajs.pop("t1")
    assert t1.stop_reason is StopReason.CONTEXT_OVERFLOW and t1.error is not None
    assert "413" in t1.error and "max_body_bytes" in t1.error
    assert len(t1.turns) == 1 and t1.num_trained_tokens > 0  # the call before the page
    for t in trajs.values():
        assert t.stop_reason is StopReason.DONE and t.reward == 1.0, t.error


async def test_a_page_under_the_body_limit_is_cut_by_the_size_check_not_tokenized(
    tokenizer: Any,
) -> None:
    """A 5 MB tool message extending an episode: the response budget's characters are checked
    before tokenizing; the refusal is the budget's (MAX_TOKENS), as after tokenizing."""
    async with AgentProxy(_engine(tokenizer), TokenBuilder(tokenizer)) as proxy:
        episode = proxy.open_episode()
        client = proxy.client(episode)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "fetch it"}]
        reply = await client.chat.completions.create(
            model="agentloop", messages=messages, tools=FETCH
        )
        [call] = reply.choices[0].message.tool_calls or []
        page = {"role": "tool", "tool_call_id": call.id, "content": "x" * (5 << 20)}
        messages += [reply.choices[0].message.model_dump(exclude_none=True), page]
        async with loop_lag() as lag:
            with pytest.raises(openai.BadRequestError, match="none are left to generate"):
                await client.chat.completions.create(
                    model="agentloop", messages=messages, tools=FETCH
                )
        assert lag.worst_s < 0.2
        assert episode.limit_hit is StopReason.MAX_TOKENS and episode.requests == 1


async def test_tokens_guard_every_route_and_each_client_sees_only_its_episodes(
    tokenizer: Any,
) -> None:
    tokens = ("alice-token", "bob-token")
    async with AgentProxy(_engine(tokenizer, ["Hi."] * 4), TokenBuilder(tokenizer),
                          open_episodes=True, tokens=tokens) as proxy:  # fmt: skip
        root = proxy.url.removesuffix("/v1")
        for key in ("", "wrong", "alice-token-but-longer"):
            got, answer = await _post(f"{root}/episodes/e1/v1/chat/completions", _chat(), key)
            assert got == 401 and answer["error"]["code"] == "invalid_api_key"
        alice = openai.AsyncOpenAI(base_url=f"{root}/episodes/e1/v1", api_key="alice-token",
                                   max_retries=0)  # fmt: skip
        await alice.chat.completions.create(model="agentloop", messages=_chat()["messages"])
        bob = openai.AsyncOpenAI(base_url=f"{root}/episodes/e1/v1", api_key="bob-token",
                                 max_retries=0)  # fmt: skip
        with pytest.raises(openai.AuthenticationError, match="belongs to another client"):
            await bob.chat.completions.create(model="agentloop", messages=_chat()["messages"])
        async with aiohttp.ClientSession() as s:
            for key, status in (("bob-token", 404), ("alice-token", 200), (None, 401)):
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                async with s.get(f"{root}/episodes/e1", headers=headers) as r:
                    assert r.status == status and r.content_type == "application/json"
        # with tokens the API key is no episode id: the episode must be in the path
        with pytest.raises(openai.AuthenticationError, match="no episode id"):
            plain = openai.AsyncOpenAI(base_url=proxy.url, api_key="alice-token", max_retries=0)
            await plain.chat.completions.create(model="agentloop", messages=_chat()["messages"])
        assert proxy.episodes["e1"].requests == 1
        async with aiohttp.ClientSession() as s:  # an id drawn by the proxy, owned by alice
            headers = {"Authorization": "Bearer alice-token"}
            async with s.post(f"{root}/episodes", headers=headers) as r:
                drawn = await r.json()
        mine = openai.AsyncOpenAI(base_url=drawn["base_url"], api_key="alice-token", max_retries=0)
        await mine.chat.completions.create(model="agentloop", messages=_chat()["messages"])
        assert proxy.episodes[drawn["episode"]].requests == 1
        for c in (alice, bob, plain, mine):
            await c.close()


async def test_serve_proxy_warns_when_open_beyond_loopback_and_reads_tokens(
    tiny_model_dir: Any, tokenizer: Any, tmp_path: Any, capsys: Any, monkeypatch: Any
) -> None:
    from agentloop.errors import ConfigError
    from agentloop.serve_proxy import ServeProxyConfig, proxy_tokens, serve_proxy

    stop = asyncio.Event()
    stop.set()  # start, print, stop
    for tokens, warned in (((), True), (("t",), False)):
        config = ServeProxyConfig(str(tiny_model_dir), host="0.0.0.0", port=0, tokens=tokens)
        await serve_proxy(config, stop=stop, engine=_engine(tokenizer))
        err = capsys.readouterr().err
        assert ("listens on 0.0.0.0 with NO authentication" in err) is warned, err
    token_file = tmp_path / "tokens"
    token_file.write_text("alice\n\nbob\n")
    assert proxy_tokens(str(token_file)) == ("alice", "bob")
    token_file.write_text("\n")
    with pytest.raises(ConfigError, match="holds no token"):
        proxy_tokens(str(token_file))
    monkeypatch.setenv("AGENTLOOP_PROXY_TOKEN", "x, y")
    assert proxy_tokens(None) == ("x", "y")


async def test_the_proxy_draws_unguessable_episode_ids_and_call_ids_hide_them(
    tokenizer: Any,
) -> None:
    async with AgentProxy(_engine(tokenizer), TokenBuilder(tokenizer), open_episodes=True) as p:
        root = p.url.removesuffix("/v1")
        ids = []
        async with aiohttp.ClientSession() as s:
            for _ in range(3):
                async with s.post(f"{root}/episodes") as r:
                    assert r.status == 201
                    answer = await r.json()
                ids.append(answer["episode"])
                assert answer["base_url"] == f"{root}/episodes/{answer['episode']}/v1"
        assert len(set(ids)) == 3 and all(len(i) >= 32 for i in ids)  # 192 random bits each
        client = openai.AsyncOpenAI(base_url=f"{root}/episodes/{ids[0]}/v1", api_key="-",
                                    max_retries=0)  # fmt: skip
        reply = await client.chat.completions.create(
            model="agentloop", messages=_chat()["messages"], tools=FETCH
        )
        [call] = reply.choices[0].message.tool_calls or []
        assert ids[0][-8:] not in call.id and ids[0][3:11] not in call.id
        await client.close()


async def test_client_episodes_expire_and_are_capped_finished_ones_first(
    tokenizer: Any,
) -> None:
    now = [1000.0]
    server = ServerLimits(episode_ttl_s=60.0, max_episodes=2)
    limits = EpisodeLimits(max_turns=1)
    async with AgentProxy(_engine(tokenizer, ["Hi."] * 8), TokenBuilder(tokenizer), limits=limits,
                          open_episodes=True, server=server) as proxy:  # fmt: skip
        proxy.episodes.clock = lambda: now[0]
        url = proxy.url + "/chat/completions"
        for key in ("a", "b"):
            assert (await _post(url, _chat(), key))[0] == 200
        got, answer = await _post(url, _chat(), "c")  # two live episodes: the cap
        assert got == 429 and answer["error"]["code"] == "too_many_episodes"
        assert (await _post(url, _chat(), "a"))[0] == 400  # max_turns=1: "a" is finished now
        assert (await _post(url, _chat(), "c"))[0] == 200  # ... so it makes room
        assert set(proxy.episodes) == {"b", "c"}
        now[0] += 61  # "b" and "c" idle past the lifetime
        assert (await _post(url, _chat(), "d"))[0] == 200
        assert set(proxy.episodes) == {"d"} and proxy.episodes.evicted == 3
        owned = proxy.open_episode("mine")  # the owner's episodes neither expire nor count
        now[0] += 3600
        assert (await _post(url, _chat(), "e"))[0] == 200
        assert proxy.episodes.lookup("mine", None) is owned


async def test_tool_set_builders_are_a_bounded_cache(tokenizer: Any) -> None:
    server = ServerLimits(max_tool_sets=3)
    async with AgentProxy(_engine(tokenizer, ["Hi."] * 8), TokenBuilder(tokenizer),
                          open_episodes=True, server=server) as proxy:  # fmt: skip
        for i in range(6):
            tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": {}}}]
            got, _ = await _post(proxy.url + "/chat/completions", _chat(tools=tools), f"e{i}")
            assert got == 200
        assert len(proxy._builders) == 3


NAN = b'{"model": "agentloop", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}'
_USER = {"role": "user", "content": "q"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (NAN, "temperature"),
        (_chat(temperature=True), "temperature"),
        (_chat(temperature=1e308), "temperature"),
        (_chat(top_p=0), "top_p"),
        (_chat(n=True), "n"),
        (_chat(max_tokens=True), "max_tokens"),
        (_chat(stream="yes"), "stream"),
        (_chat(stream_options="yes"), "stream_options"),
        ({"model": "agentloop", "messages": [_USER, {"role": "tool", "tool_call_id": "a",
          "name": {"x": 1}, "content": "x"}]}, "messages[1].name"),
        ({"model": "agentloop", "messages": [{"role": {"r": 1}, "content": "x"}]},
         "messages[0].role"),
        ({"model": "agentloop", "messages": [_USER, {"role": "assistant", "content": "",
          "tool_calls": 5}]}, "messages[1].tool_calls"),
        ({"model": "agentloop", "messages": [{"role": "user", "content": [
          {"type": "text", "text": {"x": 1}}]}]}, "messages[0].content[0].text"),
        (_chat(tools=[{"type": "function", "function": {"name": 5}}]), "tools[0].function.name"),
        (_chat(tools=[{"type": "function", "function": {}}]), "tools[0].function.name"),
        (_chat(tools=[{"type": "function", "function": {"name": "{{ 7*7 }}"}}]),
         "tools[0].function.name"),
        (_chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
         "tools[0].function"),
        ({"model": "agentloop", "prompt": [10**9]}, "prompt"),
        ({"model": "agentloop", "prompt": [2**63]}, "prompt"),
    ],
)  # fmt: skip
async def test_malformed_fields_are_openai_400s_naming_the_field(
    tokenizer: Any, body: Any, param: str
) -> None:
    """Before: NaN and a dict as a tool message's name were 500s, booleans passed as numbers,
    out-of-vocabulary ids reached the engine (500; on a GPU a device-side assert)."""
    engine = _engine(tokenizer, ["Hi."])
    async with AgentProxy(engine, TokenBuilder(tokenizer), open_episodes=True) as proxy:
        path = (
            "/completions" if isinstance(body, dict) and "prompt" in body else "/chat/completions"
        )
        got, answer = await _post(proxy.url + path, body)
        assert got == 400 and answer["error"]["param"] == param, answer
        assert answer["error"]["type"] == "invalid_request_error" and not engine.requests


async def test_prompt_ids_must_be_in_the_vocabulary(tokenizer: Any) -> None:
    engine = _engine(tokenizer, ["Hi."])
    vocab = len(tokenizer)  # the first id past the vocabulary, and the last one in it
    async with AgentProxy(engine, TokenBuilder(tokenizer), open_episodes=True) as proxy:
        url = proxy.url + "/completions"
        got, answer = await _post(url, {"model": "agentloop", "prompt": [5, vocab]})
        assert got == 400 and f"prompt[1] = {vocab} is not" in answer["error"]["message"]
        got, _ = await _post(url, {"model": "agentloop", "prompt": [vocab - 1], "max_tokens": 1})
        assert got == 200 and engine.requests[0].prompt_ids == (vocab - 1,)


async def test_an_unknown_route_is_an_openai_shaped_404(tokenizer: Any) -> None:
    async with (
        AgentProxy(_engine(tokenizer), TokenBuilder(tokenizer), open_episodes=True) as p,
        aiohttp.ClientSession() as s,
        s.get(p.url + "/../../etc/passwd") as r,
    ):
        assert r.status == 404 and r.content_type == "application/json"
        assert (await r.json())["error"]["message"].startswith("404")
