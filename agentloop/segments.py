"""Exact, cached encoding of chat-template text, one piece between added tokens at a time."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

__all__ = ["SegmentEncoder"]

_MAX_CACHED_CHARS = 32_768  # a long system prompt with tool schemas fits; huge tool outputs don't
_CACHE_ENTRIES = 1024


class SegmentEncoder:
    """Encodes text like ``backend.encode(text, add_special_tokens=False).ids``, faster.

    A Hugging Face tokenizer first splits text at its added tokens (``<|im_start|>``,
    ``<tool_call>``, …) and then normalizes, pre-tokenizes and BPE-encodes each piece on its own,
    so a text's ids are its pieces' ids in order. Chat templates repeat the same pieces — the
    system prompt with every tool schema, role headers, the turn closings — so the pieces' ids
    are cached: a prompt costs the encoding of its new parts only.

    Use :meth:`for_tokenizer`, which returns None (encode whole texts then) when the split is not
    this simple: an added token that strips whitespace, matches whole words only, or is matched
    after normalization changes its neighbours' text.
    """

    def __init__(self, encode_piece: Callable[[str], list[int]], added: dict[str, int]) -> None:
        self._added = dict(added)
        # longest first: an added token that is a prefix of another must not win
        alternatives = sorted(added, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")").split
        self._encode_piece = encode_piece
        self._cached = functools.lru_cache(maxsize=_CACHE_ENTRIES)(self._piece_tuple)

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> SegmentEncoder | None:
        """An encoder for a fast HF tokenizer, or None if its added tokens forbid piecewise."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "get_added_tokens_decoder", None)
        if backend is None or decoder is None:
            return None
        added: dict[str, int] = {}
        for token_id, token in decoder().items():
            flags = (token.lstrip, token.rstrip, token.single_word, token.normalized)
            if any(flags) or not token.content:
                return None
            added[token.content] = int(token_id)
        if not added:
            return None

        def encode_piece(text: str) -> list[int]:
            if len(text) > _MAX_CACHED_CHARS:  # same ids; encode_batch releases the GIL, so a
                # big tool output tokenized on a worker thread does not stall the event loop
                return list(backend.encode_batch([text], add_special_tokens=False)[0].ids)
            return list(backend.encode(text, add_special_tokens=False).ids)

        return cls(encode_piece, added)

    def _piece_tuple(self, piece: str) -> tuple[int, ...]:
        return tuple(self._encode_piece(piece))

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``; added tokens in it map to their ids, nothing else is added."""
        ids: list[int] = []
        for i, piece in enumerate(self._split(text)):
            if i % 2:  # re.split with one group: odd items are the separators (added tokens)
                ids.append(self._added[piece])
            elif len(piece) > _MAX_CACHED_CHARS:
                ids += self._encode_piece(piece)
            elif piece:
                ids += self._cached(piece)
        return ids
