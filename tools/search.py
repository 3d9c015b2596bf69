"""The ``search`` tool and its retrievers: the Retriever protocol, an HTTP client, a fake."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agentloop.errors import ConfigError, ToolError
from agentloop.tools.context import ToolContext
from agentloop.tools.tool import Tool, tool

__all__ = [
    "FakeRetriever",
    "HttpRetriever",
    "Passage",
    "Retriever",
    "format_passages",
    "search_tool",
]

_WORD = re.compile(r"\w+")


@dataclass(frozen=True, slots=True)
class Passage:
    """One retrieved passage: corpus id, title, text, and the retriever's score (higher first)."""

    id: str
    title: str
    text: str
    score: float = 0.0

    @property
    def contents(self) -> str:
        """Search-R1's ``contents``: the title in quotes, a newline, the text."""
        return f'"{self.title}"\n{self.text}'

    def to_document(self) -> dict[str, Any]:
        """The Search-R1 ``document`` dict (``id``, ``contents``) plus ``title`` and ``text``."""
        return {"id": self.id, "contents": self.contents, "title": self.title, "text": self.text}

    @classmethod
    def from_result(cls, item: Mapping[str, Any]) -> Passage:
        """Read one Search-R1 result: ``{"document": {...}, "score": s}`` or a bare document."""
        doc = item.get("document", item)
        score = float(item.get("score", 0.0)) if "document" in item else 0.0
        title, text = doc.get("title"), doc.get("text")
        if title is None or text is None:  # only Search-R1's '"Title"\ntext' contents
            first, _, rest = str(doc.get("contents", "")).partition("\n")
            title, text = first.strip('"'), rest
        return cls(str(doc.get("id", "")), str(title), str(text), score)


@runtime_checkable
class Retriever(Protocol):
    """Anything that ranks passages for a batch of queries: ``topk`` passages per query, best
    first. Raises :class:`ToolError` with a message the model (or user) can act on."""

    async def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]: ...


class HttpRetriever:
    """A client of a Search-R1 retrieval server (``agentloop serve-search``).

    ``url`` is the server root or its ``/retrieve`` endpoint. Each request has a ``timeout_s``
    deadline; connection errors, timeouts, 429 and 5xx are retried ``retries`` times with
    exponential backoff, other 4xx are not (the server's message is raised as a ``ToolError``).
    """

    def __init__(
        self, url: str, *, timeout_s: float = 10.0, retries: int = 2, backoff_s: float = 0.2
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"retriever url {url!r} must start with http:// or https://")
        if timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise ConfigError(
                f"HttpRetriever(timeout_s={timeout_s}, retries={retries}, backoff_s={backoff_s}): "
                "need timeout_s > 0, retries >= 0, backoff_s >= 0"
            )
        root = url.rstrip("/").removesuffix("/retrieve")
        self.url = root + "/retrieve"
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s

    async def check(self) -> None:
        """The start-up check (the search tool's ``preflight``): the server's ``GET /health``
        answers within ``timeout_s``; else a ConfigError naming the URL, before any episode
        (a dead service would otherwise show up only as tool errors the policy trains on)."""
        import aiohttp

        root = self.url.removesuffix("/retrieve")
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.get(root + "/health") as resp,
            ):
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise ConfigError(
                f"search server {root} does not answer ({detail}); check the URL and that "
                "`agentloop serve-search` runs there"
            ) from None
        if status != 200:
            raise ConfigError(f"search server {root} answered GET /health with HTTP {status}")

    async def retrieve(
        self, queries: Sequence[str], topk: int, *, session: Any = None
    ) -> list[list[Passage]]:
        """POST the queries; ``session`` (an ``aiohttp.ClientSession``) is reused if given."""
        import aiohttp

        if session is None:
            async with aiohttp.ClientSession() as own:
                return await self.retrieve(queries, topk, session=own)
        body = {"queries": list(queries), "topk": topk, "return_scores": True}
        last = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                timeout = aiohttp.ClientTimeout(total=self.timeout_s)
                async with session.post(self.url, json=body, timeout=timeout) as resp:
                    text = await resp.text()
                    if resp.status == 200:
                        return _parse_results(text, len(queries))
                    last = f"HTTP {resp.status}: {_error_text(text)}"
                    if resp.status < 500 and resp.status != 429:
                        raise ToolError(f"search request rejected ({last})")
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ToolError(
            f"search service at {self.url} failed after {self.retries + 1} attempts ({last})"
        )


def _error_text(text: str) -> str:
    try:
        return str(json.loads(text).get("error", text))[:300]
    except (ValueError, AttributeError):
        return text[:300]


def _parse_results(text: str, n: int) -> list[list[Passage]]:
    try:
        result = json.loads(text)["result"]
        out = [[Passage.from_result(item) for item in ranked] for ranked in result]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ToolError(
            f"search service sent a malformed response ({exc}): {text[:200]!r}"
        ) from exc
    if len(out) != n:
        raise ToolError(f"search service answered {len(out)} result lists for {n} queries")
    return out


class FakeRetriever:
    """In-memory retriever for tests: ranks passages by how many query words they contain."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.passages = list(passages)
        self._words = [set(_WORD.findall(f"{p.title} {p.text}".lower())) for p in self.passages]

    async def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        out = []
        for q in queries:
            words = set(_WORD.findall(q.lower()))
            scored = [(len(words & w), i) for i, w in enumerate(self._words)]
            ranked = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1]))
            out.append(
                [dataclasses.replace(self.passages[i], score=float(s)) for s, i in ranked[:topk]]
            )
        return out


def format_passages(passages: Sequence[Passage], max_chars: int) -> str:
    """``Doc 1 (Title): text`` lines, cut so the whole fits in ``max_chars`` characters: each
    passage gets an equal share and a cut text ends with ``…``; no passage is dropped."""
    if not passages:
        return "No results found."
    share = max(max_chars // len(passages), 40)
    lines = []
    for i, p in enumerate(passages, 1):
        line = f"Doc {i} ({p.title}): {' '.join(p.text.split())}"
        if len(line) > share:
            line = line[: share - 1].rsplit(" ", 1)[0] + "…"
        lines.append(line)
    return "\n".join(lines)


_SESSION_KEY = "search.http_session"


def _search(retriever: Retriever, max_topk: int, max_chars: int) -> Callable[..., Any]:
    async def search(query: str, ctx: ToolContext, topk: int = 3) -> str:
        """Search the knowledge base and read the most relevant passages.

        Args:
            query: What to look for, e.g. a name or a short question.
            topk: How many passages to return.
        """
        if not query.strip():
            raise ToolError("query is empty; pass the words to search for")
        if not 1 <= topk <= max_topk:
            raise ToolError(f"topk={topk} is out of range; use 1 to {max_topk}")
        if isinstance(retriever, HttpRetriever):  # one connection pool per episode
            import aiohttp

            session = await ctx.enter(_SESSION_KEY, aiohttp.ClientSession)
            results = await retriever.retrieve([query], topk, session=session)
        else:
            results = await retriever.retrieve([query], topk)
        return format_passages(results[0][:topk], max_chars)

    return search


_TEMPLATE = tool(name="search", timeout_s=30.0)(_search(FakeRetriever([]), 10, 1200))


def search_tool(
    retriever: Retriever | str,
    *,
    max_topk: int = 10,
    max_chars: int = 1200,
    timeout_s: float = 30.0,
    name: str = "search",
    max_concurrency: int | None = None,
    rate_limit_per_s: float | None = None,
) -> Tool:
    """A ``search(query, topk=3)`` tool over ``retriever`` (a :class:`Retriever`, or the URL of
    a retrieval server, wrapped in an :class:`HttpRetriever`).

    The passages are formatted to at most ``max_chars`` characters (every passage keeps its
    share), so they fit the rollout's tool-output budget without losing whole passages. With a
    server, the tool's ``preflight`` checks it answers (``Env.preflight``, before any episode).
    ``max_concurrency`` and ``rate_limit_per_s`` limit the calls of tool ``name`` across every
    episode of the process (protect a shared retrieval service).
    """
    if isinstance(retriever, str):
        retriever = HttpRetriever(retriever)
    if not isinstance(retriever, Retriever):
        raise ConfigError(f"search_tool needs a Retriever or a URL, got {type(retriever).__name__}")
    if max_topk < 1 or max_chars < 100:
        raise ConfigError(
            f"search_tool(max_topk={max_topk}, max_chars={max_chars}): need "
            "max_topk >= 1 and max_chars >= 100"
        )
    fn = _search(retriever, max_topk, max_chars)
    return dataclasses.replace(
        _TEMPLATE,
        name=name,
        fn=fn,
        timeout_s=timeout_s,
        max_concurrency=max_concurrency,
        rate_limit_per_s=rate_limit_per_s,
        preflight=retriever.check if isinstance(retriever, HttpRetriever) else None,
    )
