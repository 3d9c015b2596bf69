"""Cut tool output to a token budget, keeping its head and tail around a visible marker."""

from __future__ import annotations

from collections.abc import Callable

from agentloop.errors import ConfigError

__all__ = ["EXACT_CHARS", "truncate_to_tokens"]

_MAX_ROUNDS = 8
# Texts up to this many characters always take the exact path (tens of milliseconds of
# tokenizing at most), so ordinary tool output is cut as it always was, its marker counting
# tokens; only bigger ones may be cut by characters first.
EXACT_CHARS = 65_536


def _marker(dropped: int, unit: str = "tokens") -> str:
    return f"\n…[truncated {dropped} {unit}]…\n"


def truncate_to_tokens(
    text: str,
    max_tokens: int,
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    *,
    max_token_chars: int | None = None,
) -> str:
    """Return ``text`` if it encodes to at most ``max_tokens`` tokens; otherwise its first and
    last tokens joined by a marker ``\\n…[truncated N tokens]…\\n``, the whole (marker included)
    re-encoding to at most ``max_tokens`` tokens.

    Re-encoding a cut text can take more tokens than the pieces did (a cut inside a multi-byte
    character decodes to U+FFFD, merges change at the seams), so the result is checked and the
    kept part shrunk until it fits. If not even the marker fits, only the head is kept.

    ``max_token_chars`` bounds the work for huge texts: the most characters one token of the
    tokenizer spells (its longest vocabulary entry). A text of more than ``max_tokens *
    max_token_chars`` characters cannot fit, so one over twice that (and over ``EXACT_CHARS``)
    is cut by characters first: only its first and last ``max_tokens * max_token_chars``
    characters are tokenized (enough for every token that can survive), and the marker counts
    the dropped *characters* (``…[truncated N characters]…``), since the middle is never
    tokenized. Shorter texts take the exact path above, unchanged.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ConfigError(f"truncate_to_tokens: max_tokens={max_tokens!r}; use an int >= 0")
    if max_token_chars is not None and max_token_chars < 1:
        raise ConfigError(
            f"truncate_to_tokens: max_token_chars={max_token_chars!r}; use an int >= 1 or None"
        )
    exact_up_to = max(2 * max_tokens * (max_token_chars or 0), EXACT_CHARS)
    if max_token_chars is not None and len(text) > exact_up_to:
        return _cut_by_chars(text, max_tokens, max_tokens * max_token_chars, encode, decode)
    ids = encode(text)
    if len(ids) <= max_tokens:
        return text

    def marker(head: str, tail: str, kept: int) -> str:
        return _marker(len(ids) - kept)

    return _join(ids, ids, _marker(len(ids)), marker, max_tokens, encode, decode)


def _cut_by_chars(
    text: str,
    max_tokens: int,
    window: int,
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
) -> str:
    """The head + marker + tail of a text too long to fit, tokenizing only its two ends."""
    head_ids = encode(text[:window]) if window else []
    tail_ids = encode(text[len(text) - window :]) if window else []

    def marker(head: str, tail: str, kept: int) -> str:
        return _marker(max(len(text) - len(head) - len(tail), 0), "characters")

    widest = _marker(len(text), "characters")
    return _join(head_ids, tail_ids, widest, marker, max_tokens, encode, decode)


def _join(
    head_ids: list[int],
    tail_ids: list[int],
    widest_marker: str,
    marker: Callable[[str, str, int], str],
    max_tokens: int,
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
) -> str:
    """The first tokens of ``head_ids`` and the last of ``tail_ids`` around ``marker(head text,
    tail text, tokens kept)``, shrunk until the whole re-encodes within ``max_tokens``."""
    keep = max_tokens - len(encode(widest_marker))
    for _ in range(_MAX_ROUNDS):
        if keep <= 0:
            break
        head, tail = keep - keep // 2, keep // 2
        head_text = decode(head_ids[:head])
        tail_text = decode(tail_ids[len(tail_ids) - tail :]) if tail else ""
        out = head_text + marker(head_text, tail_text, keep) + tail_text
        over = len(encode(out)) - max_tokens
        if over <= 0:
            return out
        keep -= over
    return _head_only(head_ids, max_tokens, encode, decode)


def _head_only(
    ids: list[int],
    max_tokens: int,
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
) -> str:
    keep = max_tokens
    while keep > 0:
        out = decode(ids[:keep])
        over = len(encode(out)) - max_tokens
        if over <= 0:
            return out
        keep -= over
    return ""
