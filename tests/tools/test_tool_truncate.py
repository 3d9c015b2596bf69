"""truncate_to_tokens: unchanged when it fits, otherwise head + marker + tail within budget."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop.errors import ConfigError
from agentloop.tools import truncate_to_tokens
from agentloop.tools.truncate import EXACT_CHARS


def char_encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def char_decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def byte_encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def byte_decode(ids: list[int]) -> str:
    # a cut inside a multi-byte character decodes to U+FFFD, which re-encodes to 3 bytes
    return bytes(ids).decode("utf-8", errors="replace")


def test_fits_unchanged() -> None:
    assert truncate_to_tokens("hello", 5, char_encode, char_decode) == "hello"
    assert truncate_to_tokens("", 0, char_encode, char_decode) == ""


def test_keeps_head_and_tail_with_marker() -> None:
    text = "".join(f"line {i}\n" for i in range(200))
    out = truncate_to_tokens(text, 100, char_encode, char_decode)
    assert len(out) <= 100
    head, rest = out.split("\n…[truncated ", 1)
    count, tail = rest.split(" tokens]…\n", 1)
    assert text.startswith(head) and text.endswith(tail)
    assert len(head) > 20 and len(tail) > 20
    assert int(count) == len(text) - len(head) - len(tail)


def test_budget_smaller_than_marker_keeps_head_only() -> None:
    assert (
        truncate_to_tokens("abcdefghijklmnopqrstuvwxyz" * 4, 5, char_encode, char_decode) == "abcde"
    )
    assert truncate_to_tokens("abc", 0, char_encode, char_decode) == ""


def test_rejects_negative_budget() -> None:
    with pytest.raises(ConfigError, match="max_tokens=-1"):
        truncate_to_tokens("abc", -1, char_encode, char_decode)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.integers(min_value=0, max_value=200))
def test_result_always_fits_char_level(text: str, budget: int) -> None:
    out = truncate_to_tokens(text, budget, char_encode, char_decode)
    assert len(char_encode(out)) <= budget
    if len(text) <= budget:
        assert out == text
    elif budget >= 40:
        assert "…[truncated " in out


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="aé€😀\n ", max_size=200), st.integers(min_value=0, max_value=150))
def test_result_always_fits_when_cuts_reencode_longer(text: str, budget: int) -> None:
    out = truncate_to_tokens(text, budget, byte_encode, byte_decode)
    assert len(byte_encode(out)) <= budget
    if len(byte_encode(text)) <= budget:
        assert out == text


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="aé€😀\n ", max_size=400), st.integers(min_value=0, max_value=40))
def test_cut_by_characters_still_fits(text: str, budget: int) -> None:
    """Past the exact path, a text is cut by characters first; the result still fits. (One byte
    token spells at most one character: max_token_chars=1.)"""
    huge = text * (EXACT_CHARS // max(len(text), 1) + 1)
    out = truncate_to_tokens(huge, budget, byte_encode, byte_decode, max_token_chars=1)
    assert len(byte_encode(out)) <= budget


def test_huge_text_tokenizes_only_what_can_survive() -> None:
    seen: list[int] = []

    def counting_encode(text: str) -> list[int]:
        seen.append(len(text))
        return char_encode(text)

    text = "".join(f"line {i}\n" for i in range(200_000))  # 2.3 M characters
    out = truncate_to_tokens(text, 100, counting_encode, char_decode, max_token_chars=4)
    assert max(seen) <= 2 * 100 * 4  # never the whole text, only its two ends
    head, rest = out.split("\n…[truncated ", 1)
    count, tail = rest.split(" characters]…\n", 1)
    assert text.startswith(head) and text.endswith(tail) and len(out) <= 100
    assert int(count) == len(text) - len(head) - len(tail)


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=300), st.integers(min_value=0, max_value=120))
def test_texts_within_the_exact_bound_are_cut_as_before(text: str, budget: int) -> None:
    assert truncate_to_tokens(text, budget, char_encode, char_decode, max_token_chars=1) == (
        truncate_to_tokens(text, budget, char_encode, char_decode)
    )


def test_rejects_bad_max_token_chars() -> None:
    with pytest.raises(ConfigError, match="max_token_chars=0"):
        truncate_to_tokens("abc", 1, char_encode, char_decode, max_token_chars=0)
