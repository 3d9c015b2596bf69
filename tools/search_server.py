"""The retrieval server: Search-R1's ``POST /retrieve`` and ``GET /health`` over aiohttp.

Request: ``{"queries": ["..."], "topk": 3, "return_scores": false}``. Response:
``{"result": [[doc, ...], ...]}`` (one ranked list per query), where ``doc`` is
``{"id", "contents", "title", "text"}`` — or ``{"document": doc, "score": s}`` with
``return_scores`` — exactly what Search-R1 clients read.

Queries of concurrent requests with the same ``topk`` are batched together (up to
``max_batch``) and searched on at most ``max_concurrency`` worker threads, so an answer does not
depend on what else is in flight: BM25 scores each query on its own (answers identical to a
request sent alone); the dense encoder pads a batch to its longest query, which can move a
score by ~1e-7, so a dense or hybrid ranking can differ only between passages tied that closely.
A bad request gets a 4xx with ``{"error": "..."}`` naming the
problem; a query the index fails on fails only its own request (500, JSON). Connections go
through :class:`agentloop.sandboxes.http_server.HttpServer` (header and body timeouts, a
connection cap, rate-limited logs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agentloop.errors import ConfigError
from agentloop.sandboxes.http_limits import HttpLimits
from agentloop.sandboxes.http_server import HttpServer, internal_error
from agentloop.tools.search_index import SearchIndex

__all__ = ["SearchServerConfig", "make_app", "run_search_server", "serve_search"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchServerConfig:
    """Limits of the retrieval server."""

    max_queries: int = 256  # per request
    max_topk: int = 100
    max_query_chars: int = 4096
    max_batch: int = 64  # queries searched together, across requests
    max_concurrency: int = 2  # batches searched at once (worker threads)
    max_body_bytes: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_queries", "max_topk", "max_query_chars", "max_batch", "max_concurrency"):
            if getattr(self, name) < 1:
                raise ConfigError(f"search server {name} must be >= 1, got {getattr(self, name)}")


class _BadRequest(Exception):
    pass


@dataclass
class _Job:
    queries: list[str]
    topk: int
    future: asyncio.Future[list[list[tuple[int, float]]]]


class _Batcher:
    """Collects the queries of concurrent requests into batches for the index."""

    def __init__(self, index: SearchIndex, config: SearchServerConfig) -> None:
        self.index, self.config = index, config
        self.queue: asyncio.Queue[_Job] = asyncio.Queue()
        self.pool = ThreadPoolExecutor(config.max_concurrency, thread_name_prefix="search")
        self.workers: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.workers = [
            asyncio.create_task(self._work()) for _ in range(self.config.max_concurrency)
        ]

    async def stop(self) -> None:
        for w in self.workers:
            w.cancel()
        await asyncio.gather(*self.workers, return_exceptions=True)
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def search(self, queries: list[str], topk: int) -> list[list[tuple[int, float]]]:
        job = _Job(queries, topk, asyncio.get_running_loop().create_future())
        await self.queue.put(job)
        return await job.future

    async def _work(self) -> None:
        while True:
            jobs = [await self.queue.get()]
            size = len(jobs[0].queries)
            while size < self.config.max_batch and not self.queue.empty():
                job = self.queue.get_nowait()
                jobs.append(job)
                size += len(job.queries)
            by_topk: dict[int, list[_Job]] = {}
            for job in jobs:  # one search per topk: a request's answer never sees another's k
                by_topk.setdefault(job.topk, []).append(job)
            for topk, group in by_topk.items():
                await self._search(group, topk)

    async def _search(self, jobs: list[_Job], topk: int) -> None:
        """Search ``jobs`` together; if that fails, each alone, so only a bad one fails."""
        loop = asyncio.get_running_loop()
        queries = [q for j in jobs for q in j.queries]
        try:
            ranked = await loop.run_in_executor(self.pool, self.index.search, queries, topk)
        except Exception as exc:
            if len(jobs) > 1:
                for job in jobs:
                    await self._search([job], topk)
            elif not jobs[0].future.done():
                jobs[0].future.set_exception(exc)
            return
        at = 0
        for j in jobs:
            if not j.future.done():
                j.future.set_result(ranked[at : at + len(j.queries)])
            at += len(j.queries)


def _parse(body: bytes, config: SearchServerConfig) -> tuple[list[str], int, bool]:
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise _BadRequest(f"the body is not valid JSON ({exc})") from exc
    except RecursionError:  # json's C parser refuses deep nesting this way
        raise _BadRequest("the body is JSON nested too deeply; send a flat object") from None
    if not isinstance(data, dict) or "queries" not in data:
        raise _BadRequest('the body must be a JSON object with "queries": ["..."] and "topk": k')
    queries, topk = data["queries"], data.get("topk", 3)
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list) or not queries:
        raise _BadRequest(f'"queries" must be a non-empty list of strings, got {queries!r:.80}')
    if len(queries) > config.max_queries:
        raise _BadRequest(
            f"{len(queries)} queries in one request; send at most {config.max_queries}"
        )
    for i, q in enumerate(queries):
        if not isinstance(q, str) or not q.strip():
            raise _BadRequest(f"queries[{i}] must be a non-empty string, got {q!r:.80}")
        if len(q) > config.max_query_chars:
            raise _BadRequest(
                f"queries[{i}] has {len(q)} characters; the limit is {config.max_query_chars}"
            )
        try:
            q.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _BadRequest(
                f"queries[{i}] is not valid Unicode text (a lone surrogate at character "
                f"{exc.start}: {q[exc.start]!r}); send UTF-8 text"
            ) from None
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= config.max_topk:
        raise _BadRequest(f'"topk" must be an integer in [1, {config.max_topk}], got {topk!r:.40}')
    return queries, topk, bool(data.get("return_scores", False))


_HINTS = {
    404: "the endpoints are POST /retrieve and GET /health",
    405: "use POST for /retrieve and GET for /health",
    413: "the request body is too large; send fewer or shorter queries",
}


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own 4xx (404, 405, 413) as JSON with a message, like ours; any unexpected
    exception as a JSON 500, logged once."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        hint = _HINTS.get(exc.status, exc.reason)
        return web.json_response({"error": f"{exc.reason}: {hint}"}, status=exc.status)
    except Exception as exc:
        return internal_error(request, exc, log)


def make_app(index: SearchIndex, config: SearchServerConfig | None = None) -> web.Application:
    """The aiohttp application serving ``index``."""
    config = config or SearchServerConfig()
    batcher = _Batcher(index, config)

    async def retrieve(request: web.Request) -> web.Response:
        try:
            queries, topk, with_scores = _parse(await request.read(), config)
        except _BadRequest as exc:
            return web.json_response({"error": str(exc)}, status=400)
        try:
            ranked = await batcher.search(queries, topk)
        except Exception as exc:  # the index failed on this request's queries only
            log.warning("search failed: %s: %s", type(exc).__name__, exc)
            error = f"the index failed on these queries ({type(exc).__name__}: {exc})"
            return web.json_response({"error": error}, status=500)
        result = []
        for rows in ranked:
            docs = [index.docs.get(r, s) for r, s in rows]
            result.append(
                [
                    {"document": d.to_document(), "score": d.score}
                    if with_scores
                    else d.to_document()
                    for d in docs
                ]
            )
        return web.json_response({"result": result})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "index": index.kind, "docs": len(index.docs)})

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        batcher.start()
        yield
        await batcher.stop()

    app = web.Application(middlewares=[_json_errors], client_max_size=config.max_body_bytes)
    app.router.add_post("/retrieve", retrieve)
    app.router.add_get("/health", health)
    app.cleanup_ctx.append(lifecycle)
    return app


async def serve_search(
    index: SearchIndex,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    config: SearchServerConfig | None = None,
    http: HttpLimits | None = None,
    stop: asyncio.Event | None = None,
    on_start: Callable[[int], Any] | None = None,
) -> None:
    """Serve ``index`` until ``stop`` is set (or SIGTERM/SIGINT); ``on_start`` gets the port."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)
    server = HttpServer(make_app(index, config), http, loggers=(__name__,))
    bound = await server.start(host, port)
    try:
        if on_start is not None:
            on_start(bound)
        await stop.wait()
    finally:
        await server.stop()


def run_search_server(
    index: SearchIndex,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    config: SearchServerConfig | None = None,
    http: HttpLimits | None = None,
) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM)."""
    asyncio.run(serve_search(index, host=host, port=port, config=config, http=http))
