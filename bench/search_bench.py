"""Retrieval server throughput and latency, BM25 and dense, on a synthetic 100k-passage corpus.

    python bench/search_bench.py [--docs 100000] [--queries 2000] [--concurrency 64]
                                 [--kinds bm25,dense] [--workdir ~/.cache/agentloop/search-bench]

For each index kind it prints, side by side: the ceiling — the index searched in-process in
batches of the server's ``max_batch`` (no HTTP, no JSON) — and ours: the aiohttp server on
loopback answering ``--queries`` single-query ``POST /retrieve`` requests, ``--concurrency`` in
flight, in queries/s with p50/p99 request latency. Client and server share this process (and the
machine's cores). Indexes are built once into ``--workdir`` and reused (the dense build encodes
every passage with all-MiniLM-L6-v2: minutes on a laptop CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from agentloop.envs.search_qa import synthetic_corpus, write_corpus
from agentloop.tools.search_index import build_index, load_index
from agentloop.tools.search_server import SearchServerConfig, make_app


def _queries(corpus_titles: list[str], n: int) -> list[str]:
    rng = random.Random(0)
    forms = ("{}", "Who founded {}?", "Where is {}?", "{} currency", "born in {}")
    return [rng.choice(forms).format(rng.choice(corpus_titles)) for _ in range(n)]


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def ceiling(index: Any, queries: list[str], batch: int) -> float:
    """Queries/s of the index itself, searched in batches in this thread."""
    index.search(queries[:batch], 3)  # warm-up (first touch of the memory-mapped files)
    start = time.perf_counter()
    for i in range(0, len(queries), batch):
        index.search(queries[i : i + batch], 3)
    return len(queries) / (time.perf_counter() - start)


async def served(index: Any, queries: list[str], concurrency: int) -> tuple[float, list[float]]:
    """Queries/s and per-request latencies (s) of the server on loopback."""
    runner = web.AppRunner(make_app(index, SearchServerConfig()))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/retrieve"  # type: ignore[union-attr]
    latencies: list[float] = []
    slots = asyncio.Semaphore(concurrency)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:

            async def one(q: str) -> None:
                async with slots:
                    t0 = time.perf_counter()
                    async with s.post(url, json={"queries": [q], "topk": 3}) as r:
                        await r.read()
                        assert r.status == 200, r.status
                    latencies.append(time.perf_counter() - t0)

            await asyncio.gather(*(one(q) for q in queries[:concurrency]))  # warm-up
            latencies.clear()
            start = time.perf_counter()
            await asyncio.gather(*(one(q) for q in queries))
            elapsed = time.perf_counter() - start
    finally:
        await runner.cleanup()
    return len(queries) / elapsed, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--kinds", default="bm25,dense")
    parser.add_argument("--workdir", default="~/.cache/agentloop/search-bench")
    args = parser.parse_args()
    work = Path(args.workdir).expanduser() / f"{args.docs}"
    corpus_file = work / "corpus.jsonl"
    passages = synthetic_corpus(args.docs)
    if not corpus_file.is_file():
        write_corpus(corpus_file, passages)
    queries = _queries([p.title for p in passages], args.queries)
    rows = []
    for kind in args.kinds.split(","):
        directory = work / kind
        build_s = float("nan")
        if not (directory / "meta.json").is_file():
            t0 = time.perf_counter()
            build_index(corpus_file, directory, kind=kind)
            build_s = time.perf_counter() - t0
        index = load_index(directory, kind=kind)
        batch_qps = ceiling(index, queries, SearchServerConfig().max_batch)
        qps, lat = asyncio.run(served(index, queries, args.concurrency))
        rows.append((kind, len(index.docs), build_s, batch_qps, qps,
                     statistics.median(lat) * 1e3, _percentile(lat, 99) * 1e3))  # fmt: skip
    print(f"\n{args.queries} single-query requests, {args.concurrency} in flight, top-3")
    head = ("index", "docs", "build s", "ceiling q/s", "server q/s", "p50 ms", "p99 ms")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for kind, docs, build_s, batch_qps, qps, p50, p99 in rows:
        print(f"| {kind} | {docs:,} | {build_s:.0f} | {batch_qps:,.0f} | {qps:,.0f} | "
              f"{p50:.1f} | {p99:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
