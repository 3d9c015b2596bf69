"""Search fixtures: the SearchQA corpus on disk and its indexes, built once per session."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from search_helpers import load_bm25, served_index


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentloop.envs.search_qa import write_corpus

    return write_corpus(tmp_path_factory.mktemp("searchqa") / "corpus.jsonl")


@pytest.fixture(scope="session")
def bm25_dir(corpus_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentloop.tools.search_index import build_index

    return build_index(corpus_file, tmp_path_factory.mktemp("bm25"), kind="bm25", progress=False)


@pytest.fixture(scope="session")
def encoder() -> Any:
    from agentloop.tools.search_index import MiniLMEncoder

    return MiniLMEncoder()


@pytest.fixture(scope="session")
def hybrid_dir(corpus_file: Path, encoder: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BM25 and dense (all-MiniLM-L6-v2) over the 340 passages: the slow fixture (~30 s)."""
    from agentloop.tools.search_index import build_index

    out = tmp_path_factory.mktemp("hybrid")
    return build_index(corpus_file, out, kind="hybrid", encoder=encoder, progress=False)


@pytest_asyncio.fixture
async def search_url(bm25_dir: Path) -> AsyncIterator[str]:
    """A retrieval server on a free loopback port, serving the BM25 index."""
    async for url in served_index(load_bm25(bm25_dir)):
        yield url
