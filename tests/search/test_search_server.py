"""The retrieval server on loopback: Search-R1 protocol, 1,000 concurrent queries, 4xx, client."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from search_helpers import load_bm25, served_index

from agentloop.cli import main
from agentloop.envs import make
from agentloop.envs.search_qa import searchqa_corpus, searchqa_tasks
from agentloop.errors import ConfigError, ToolError
from agentloop.tools.search import FakeRetriever, HttpRetriever, Passage, format_passages
from agentloop.types import Message, ToolCall

pytestmark = pytest.mark.integration


async def test_retrieve_speaks_search_r1(search_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{search_url}/health") as r:
            assert r.status == 200 and await r.json() == {
                "status": "ok",
                "index": "bm25",
                "docs": 340,
            }
        body = {"queries": ["Vaiduth", "Hesta Stavol"], "topk": 2}
        async with s.post(f"{search_url}/retrieve", json=body) as r:
            plain = (await r.json())["result"]
        async with s.post(f"{search_url}/retrieve", json={**body, "return_scores": True}) as r:
            scored = (await r.json())["result"]
    assert [len(x) for x in plain] == [2, 2]
    top = plain[0][0]
    assert top["id"] == "country-0000" and top["contents"].startswith('"Vaiduth"\n')
    assert scored[1][0]["document"]["title"] == "Hesta Stavol"
    assert scored[1][0]["score"] >= scored[1][1]["score"] > 0
    assert Passage.from_result(scored[1][0]).id == "person-0040"
    assert Passage.from_result({"id": "q", "contents": '"T"\nbody'}) == Passage("q", "T", "body")


async def test_1000_concurrent_queries_none_lost(search_url: str) -> None:
    """Every hop query of the corpus, sent as 1,000 concurrent requests; each answer must be
    there and be the answer to *its* query (BM25 hop recall@1 is 1.0 on this corpus)."""
    hops = [h for t in searchqa_tasks("train") + searchqa_tasks("test") for h in t.data["hops"]]
    hops = (hops * 2)[:1000]
    connector = aiohttp.TCPConnector(limit=200)
    async with aiohttp.ClientSession(connector=connector) as s:

        async def one(query: str) -> tuple[int, Any]:
            async with s.post(f"{search_url}/retrieve", json={"queries": [query], "topk": 1}) as r:
                return r.status, await r.json()

        answers = await asyncio.wait_for(
            asyncio.gather(*(one(h["query"]) for h in hops)), timeout=240
        )
    assert len(answers) == 1000 and all(status == 200 for status, _ in answers)
    got = [body["result"][0][0]["id"] for _, body in answers]
    assert got == [h["doc_id"] for h in hops]


@pytest.mark.parametrize(
    ("method", "path", "payload", "status", "message"),
    [
        ("POST", "/retrieve", b"{not json", 400, "not valid JSON"),
        ("POST", "/retrieve", b"[1, 2]", 400, "JSON object"),
        ("POST", "/retrieve", {"topk": 3}, 400, '"queries"'),
        ("POST", "/retrieve", {"queries": []}, 400, "non-empty list"),
        ("POST", "/retrieve", {"queries": [3]}, 400, "queries\\[0\\] must be a non-empty string"),
        ("POST", "/retrieve", {"queries": ["ok", "  "]}, 400, "queries\\[1\\]"),
        ("POST", "/retrieve", {"queries": ["a"], "topk": 0}, 400, "topk"),
        ("POST", "/retrieve", {"queries": ["a"], "topk": 101}, 400, "\\[1, 100\\]"),
        ("POST", "/retrieve", {"queries": ["a"], "topk": "3"}, 400, "topk"),
        ("POST", "/retrieve", {"queries": ["a"] * 65}, 400, "at most 64"),
        ("POST", "/retrieve", {"queries": ["a" * 5000]}, 400, "limit is 4096"),
        ("POST", "/retrieve", {"queries": ["a" * 1000] * 60_00}, 413, "too large"),
        ("POST", "/retrieve", b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
        ("POST", "/retrieve", b'{"queries": ["ok \\ud800"]}', 400, "lone surrogate"),
        ("GET", "/retrieve", None, 405, "use POST"),
        ("POST", "/search", {"queries": ["a"]}, 404, "POST /retrieve"),
    ],
)
async def test_malformed_requests_get_4xx_with_a_message(
    search_url: str, method: str, path: str, payload: Any, status: int, message: str
) -> None:
    data = payload if isinstance(payload, bytes) or payload is None else json.dumps(payload)
    async with aiohttp.ClientSession() as s, s.request(method, search_url + path, data=data) as r:
        assert r.status == status
        body = await r.json()
    assert re.search(message, body["error"]), body


class _Recording:
    """The BM25 index, recording each batch it is asked for; ``boom`` makes a query fail, and
    ``k_dependent`` makes a query's top rows depend on k (as hybrid retrieval's do: it fuses
    candidate lists of 2k), so a batch searched at another request's k would show."""

    def __init__(self, inner: Any, k_dependent: bool = False) -> None:
        self.inner, self.kind, self.docs = inner, inner.kind, inner.docs
        self.k_dependent, self.batches = k_dependent, []  # type: list[int]

    def search(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        self.batches.append(len(queries))
        if any("boom" in q for q in queries):
            raise ValueError("the index cannot score 'boom'")
        if not self.k_dependent:
            return self.inner.search(queries, k)
        wide = self.inner.search(queries, 2 * k)
        return [sorted(rows, key=lambda rs: rs[0])[:k] for rows in wide]


async def _retrieve(s: aiohttp.ClientSession, url: str, queries: list[str], k: int) -> Any:
    async with s.post(f"{url}/retrieve", json={"queries": queries, "topk": k}) as r:
        return r.status, r.content_type, await r.json()


@pytest.mark.parametrize("k_dependent", [False, True])
async def test_concurrent_mixed_requests_get_their_solo_answers(
    bm25_dir: Path, k_dependent: bool
) -> None:
    """Requests with different topk and one bad query, sent together, get exactly what each
    gets alone: its own k results, and the bad one alone fails (JSON 500)."""

    index = _Recording(load_bm25(bm25_dir), k_dependent)
    hops = [h["query"] for t in searchqa_tasks("train")[:12] for h in t.data["hops"]][:24]
    requests = [([q], 1 + i % 7) for i, q in enumerate(hops)] + [(["boom", hops[0]], 3)]
    async for url in served_index(index, max_concurrency=1):
        async with aiohttp.ClientSession() as s:
            solo = [await _retrieve(s, url, q, k) for q, k in requests]
            index.batches.clear()
            together = await asyncio.gather(*(_retrieve(s, url, q, k) for q, k in requests))
    assert max(index.batches) > 1, "the requests were never batched: nothing was tested"
    assert together == solo
    *good, bad = together
    assert all(status == 200 for status, _, _ in good)
    assert all(len(b["result"][0]) <= k for (_, _, b), (_, k) in zip(good, requests, strict=False))
    assert bad[:2] == (500, "application/json") and "boom" in bad[2]["error"]


@pytest_asyncio.fixture
async def flaky_url() -> AsyncIterator[tuple[str, list[int]]]:
    """A server that answers 503 twice, then like a retrieval server; 400 for 'bad'."""
    calls: list[int] = []

    async def retrieve(request: web.Request) -> web.Response:
        body = await request.json()
        calls.append(1)
        if body["queries"] == ["bad"]:
            return web.json_response({"error": "queries[0] is bad"}, status=400)
        if len(calls) <= 2:
            return web.json_response({"error": "busy"}, status=503)
        doc = {"id": "d1", "contents": '"Title"\ntext'}
        return web.json_response({"result": [[{"document": doc, "score": 1.5}]]})

    app = web.Application()
    app.router.add_post("/retrieve", retrieve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", calls
    await runner.cleanup()


async def test_http_retriever_retries_then_reports(flaky_url: tuple[str, list[int]]) -> None:
    url, calls = flaky_url
    retriever = HttpRetriever(url, retries=2, backoff_s=0.01)
    assert await retriever.retrieve(["q"], 1) == [[Passage("d1", "Title", "text", 1.5)]]
    assert len(calls) == 3
    with pytest.raises(ToolError, match="rejected \\(HTTP 400: queries\\[0\\] is bad\\)"):
        await retriever.retrieve(["bad"], 1)
    assert len(calls) == 4  # a 4xx is not retried
    dead = HttpRetriever("http://127.0.0.1:9/retrieve", retries=1, backoff_s=0.01, timeout_s=2)
    with pytest.raises(ToolError, match="failed after 2 attempts"):
        await dead.retrieve(["q"], 1)
    with pytest.raises(ConfigError, match="must start with http"):
        HttpRetriever("localhost:8000")


def test_passages_are_formatted_within_the_budget() -> None:
    long = [Passage(str(i), f"T{i}", "word " * 400) for i in range(5)]
    text = format_passages(long, 600)
    assert len(text) <= 600 + 5 and text.count("Doc ") == 5 and text.count("…") == 5
    short = format_passages(long[:1], 10_000)
    assert "…" not in short and short.startswith("Doc 1 (T0): word word")
    assert format_passages([], 100) == "No results found."


async def test_search_tool_episode_against_the_server(search_url: str) -> None:
    env = make("agentloop/SearchQA-v0", retriever=search_url)
    task = searchqa_tasks("test")[1]
    await env.reset(options={"task": task})
    hop = task.data["hops"][0]
    calls = (
        ToolCall("search", {"query": hop["query"]}, id="1"),
        ToolCall("search", {"query": hop["query"], "topk": 99}, id="2"),
        ToolCall("search", {"query": " "}, id="3"),
    )
    result = await env.step(Message("assistant", "…", calls))
    ok, big, empty = result.tool_results
    assert not ok.is_error and hop["query"] in ok.content and ok.content.count("Doc ") == 3
    assert big.is_error and "topk=99 is out of range" in big.content
    assert empty.is_error and "query is empty" in empty.content
    await env.close()


async def test_the_search_server_is_checked_before_any_episode(
    search_url: str, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await make("agentloop/SearchQA-v0", retriever=search_url).preflight()  # it answers
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{free.getsockname()[1]}"
    with pytest.raises(ConfigError, match=rf"search server {dead} does not answer"):
        await make("agentloop/SearchQA-v0", retriever=dead).preflight()
    args = ["eval", "--env", "agentloop/SearchQA-v0", "--env-arg", f"retriever={dead}",
            "--model", str(tiny_model_dir), "--engine", "hf", "--out", str(tmp_path / "run"),
            "--num-tasks", "1", "--quiet"]  # fmt: skip
    assert await asyncio.to_thread(main, args) == 2  # named at start-up, nothing played
    assert f"search server {dead} does not answer" in capsys.readouterr().err
    assert not (tmp_path / "run" / "trajectories.jsonl").exists()


async def test_fake_retriever_ranks_by_overlap() -> None:
    fake = FakeRetriever(searchqa_corpus())
    (ranked,) = await fake.retrieve(["Vaiduth currency"], 2)
    assert ranked[0].title == "Vaiduth" and ranked[0].score == 2.0


def test_serve_search_cli_builds_then_serves(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "agentloop.cli", "serve-search", "--corpus", "searchqa",
           "--index", str(tmp_path / "idx"), "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, health = time.monotonic() + 120, None
        while health is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    health = json.loads(r.read())
            except OSError:
                time.sleep(0.3)
        assert health == {"status": "ok", "index": "bm25", "docs": 340}, proc.poll()
        assert (tmp_path / "idx" / "meta.json").is_file()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    missing = subprocess.run(
        [sys.executable, "-m", "agentloop.cli", "serve-search", "--index", str(tmp_path / "no")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode == 2 and "pass --corpus FILE" in missing.stderr
