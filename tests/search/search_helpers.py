"""Serving a search index on loopback for the tests: shared by the fixtures and the tests that
build their own index (conftest modules are not importable by name under xdist)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

__all__ = ["load_bm25", "served_index"]


def load_bm25(bm25_dir: Path) -> Any:
    from agentloop.tools.search_index import load_index

    return load_index(bm25_dir)


async def served_index(index: Any, **config: Any) -> AsyncIterator[str]:
    """``index`` behind the real server and transport (HttpServer) on a free loopback port."""
    from agentloop.sandboxes.http_server import HttpServer
    from agentloop.tools.search_server import SearchServerConfig, make_app

    server = HttpServer(make_app(index, SearchServerConfig(**{"max_queries": 64, **config})))
    port = await server.start("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await server.stop()
