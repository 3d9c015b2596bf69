"""Proxy throughput: N concurrent openai-SDK episodes through AgentProxy vs. the engine called
directly, on loopback, with a scripted engine (no model: the proxy's own cost is what's measured).

Each episode makes ``--turns`` chat requests (each answered with a tool call, whose result the
agent sends back), once through the openai SDK (what agents use; the client's own CPU is in the
same process and counts) and once over plain aiohttp; the direct baseline makes the same
generate calls and builds the same token ids with the TokenBuilder, with no HTTP. Reports
requests/s each way and checks that no request was lost (every episode recorded every request,
in one token-exact segment).

    python bench/proxy_bench.py --episodes 256 --turns 3
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from transformers import AutoTokenizer

from agentloop.chat import TokenBuilder
from agentloop.engines.base import SamplingParams
from agentloop.engines.fake import FakeEngine
from agentloop.models.tiny import tiny_model_dir
from agentloop.proxy import AgentProxy, EpisodeLimits
from agentloop.testing.calc_agent import CALC_TOOLS
from agentloop.types import Message

CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'


def _engine(tokenizer: Any) -> FakeEngine:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return FakeEngine([CALL] * 64, tokenizer=tokenizer, eos_token_id=eos)


async def _episode(proxy: AgentProxy, k: int, turns: int) -> int:
    client = proxy.client(proxy.open_episode(f"ep-{k}"))  # what AgentEnv hands its agent
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"What is 6 * 7? ({k})"}]
    for _ in range(turns):
        r = await client.chat.completions.create(
            model="agentloop", messages=messages, tools=CALC_TOOLS
        )
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "42"})
    return turns


async def _episode_raw(proxy: AgentProxy, http: aiohttp.ClientSession, k: int, turns: int) -> int:
    """The same episode over plain aiohttp (no SDK): the proxy's own cost plus HTTP."""
    headers = {"Authorization": f"Bearer {proxy.open_episode(f'ep-{k}').id}"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"What is 6 * 7? ({k})"}]
    for _ in range(turns):
        body = {"model": "agentloop", "messages": messages, "tools": CALC_TOOLS}
        async with http.post(f"{proxy.url}/chat/completions", json=body, headers=headers) as r:
            msg = (await r.json())["choices"][0]["message"]
        messages.append(msg)
        for call in msg.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "42"})
    return turns


async def _via_proxy(
    tokenizer: Any, episodes: int, turns: int, raw: bool = False
) -> tuple[float, int, int]:
    engine = _engine(tokenizer)
    limits = EpisodeLimits(max_turns=turns, max_prompt_len=2048, max_response_len=2048)
    async with AgentProxy(
        engine, TokenBuilder(tokenizer), open_episodes=True, limits=limits
    ) as proxy:
        await _episode(proxy, -1, 1)  # warm-up: the openai SDK imports its types on first use
        engine.requests.clear()
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            t0 = time.perf_counter()
            done = await asyncio.gather(
                *(
                    _episode_raw(proxy, http, k, turns) if raw else _episode(proxy, k, turns)
                    for k in range(episodes)
                )
            )
            elapsed = time.perf_counter() - t0
        proxy.close_episode("ep--1")
        recorded = sum(ep.requests for ep in proxy.episodes.values())
        segments = sum(len(ep.segments) for ep in proxy.episodes.values())
    if not sum(done) == recorded == len(engine.requests) == episodes * turns:
        raise RuntimeError(
            f"a request was lost: {episodes * turns} sent, {sum(done)} answered, {recorded} "
            f"recorded, {len(engine.requests)} generated"
        )
    if segments != episodes:
        raise RuntimeError(f"{segments} segments for {episodes} episodes: not token-exact")
    return elapsed, recorded, proxy.requests_failed


async def _direct(tokenizer: Any, episodes: int, turns: int) -> float:
    engine, builder = _engine(tokenizer), TokenBuilder(tokenizer, tools=CALC_TOOLS)

    async def one(k: int) -> None:
        ids = builder.prompt_ids([Message("user", f"What is 6 * 7? ({k})")])
        for _ in range(turns):
            c = await engine.generate(ids, SamplingParams(max_tokens=256), session_id=f"d{k}")
            ids = ids + list(c.token_ids)
            ids += builder.observation_ids([Message("tool", "42", tool_call_id="x")], c.token_ids)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(episodes)))
    return time.perf_counter() - t0


@dataclass(frozen=True)
class Run:
    """One way of serving the requests: seconds taken, requests recorded and refused
    (``recorded``/``failed`` are 0 for the direct baseline, which has no proxy)."""

    label: str
    requests: int
    elapsed_s: float
    recorded: int = 0
    failed: int = 0


def main(argv: Sequence[str] | None = None) -> list[Run]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    n = args.episodes * args.turns
    print(f"{args.episodes} concurrent episodes x {args.turns} requests = {n} requests")
    runs = []
    for label, raw in (("proxy, openai SDK", False), ("proxy, plain HTTP", True)):
        elapsed, recorded, failed = asyncio.run(
            _via_proxy(tokenizer, args.episodes, args.turns, raw)
        )
        runs.append(Run(label, n, elapsed, recorded, failed))
        print(
            f"{label:18}: {elapsed:6.2f} s {n / elapsed:8.1f} req/s  recorded {recorded}, "
            f"failed {failed}"
        )
    direct = asyncio.run(_direct(tokenizer, args.episodes, args.turns))
    runs.append(Run("direct", n, direct))
    print(f"{'direct':18}: {direct:6.2f} s {n / direct:8.1f} req/s  (engine + TokenBuilder)")
    return runs


if __name__ == "__main__":
    main()
