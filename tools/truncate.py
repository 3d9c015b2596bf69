"""Cut tool output to a token budget, keeping its head and tail around a visible marker."""

from __future__ import annotations

from collections.abc import Callable

from agentloop.errors import ConfigError

__all__ = ["truncate_to_tokens"]

_MAX_ROUNDS = 8


def _marker(dropped: int) -> str:
    return f"\n…[truncated {dropped} tokens]…\n"


def truncate_to_tokens(
    text: str,
    max_tokens: int,
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
) -> str:
    """Return ``text`` if it encodes to at most ``max_tokens`` tokens; otherwise its first and
    last tokens joined by a marker ``\\n…[truncated N tokens]…\\n``, the whole (marker included)
    re-encoding to at most ``max_tokens`` tokens.

    Re-encoding a cut text can take more tokens than the pieces did (a cut inside a multi-byte
    character decodes to U+FFFD, merges change at the seams), so the result is checked and the
    kept part shrunk until it fits. If not even the marker fits, only the head is kept.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ConfigError(f"truncate_to_tokens: max_tokens={max_tokens!r}; use an int >= 0")
    ids = encode(text)
    if len(ids) <= max_tokens:
        return text
    keep = max_tokens - len(encode(_marker(len(ids))))
    for _ in range(_MAX_ROUNDS):
        if keep <= 0:
            break
        head, tail = keep - keep // 2, keep // 2
        tail_ids = ids[len(ids) - tail :] if tail else []
        out = decode(ids[:head]) + _marker(len(ids) - keep) + decode(tail_ids)
        over = len(encode(out)) - max_tokens
        if over <= 0:
            return out
        keep -= over
    return _head_only(ids, max_tokens, encode, decode)


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
