"""The retrieval server answers an unexpected exception as JSON 500, logged once (issue 21)."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest

from agentloop.sandboxes.http_server import HttpServer
from agentloop.tools.search_server import make_app

pytestmark = [pytest.mark.integration]


class _BrokenDocs:
    def __len__(self) -> int:
        return 1

    def get(self, row: int, score: float) -> Any:
        raise RuntimeError("the passage store is corrupt")


class _BrokenIndex:
    """Searches fine, then fails looking up a passage: a bug the handler does not expect."""

    kind = "fake"
    docs = _BrokenDocs()

    def search(self, queries: list[str], topk: int) -> list[list[tuple[int, float]]]:
        return [[(0, 1.0)] for _ in queries]


async def test_an_unexpected_exception_is_a_json_500_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = HttpServer(make_app(_BrokenIndex()))  # type: ignore[arg-type]
    url = f"http://127.0.0.1:{await server.start()}/retrieve"
    try:
        with caplog.at_level(logging.ERROR):
            async with (
                aiohttp.ClientSession() as http,
                http.post(url, json={"queries": ["q"], "topk": 1}) as r,
            ):
                assert (r.status, r.content_type) == (500, "application/json"), await r.text()
                body = await r.json()
        assert body["type"] == "InternalError" and "RuntimeError" in body["error"], body
        assert "corrupt" not in body["error"]  # details go to the server's log only
        logged = [r for r in caplog.records if r.exc_info and "corrupt" in str(r.exc_info[1])]
        assert len(logged) == 1, caplog.records
        async with (
            aiohttp.ClientSession() as http,
            http.get(url[: -len("retrieve")] + "health") as r,
        ):
            assert r.status == 200  # the server keeps serving
    finally:
        await server.stop()
