"""Kernel protocol pieces: sentinel sections across chunk boundaries, capped capture."""

from __future__ import annotations

import asyncio

from agentloop.sandboxes.protocol import Capture, SectionReader, new_sentinel


def test_capture_keeps_the_head_and_counts_the_rest() -> None:
    cap = Capture(5)
    for chunk in (b"abc", b"defg", b"h"):
        cap.add(chunk)
    assert bytes(cap.data) == b"abcde" and cap.total == 8 and cap.truncated
    assert Capture(5).text() == "" and not Capture(5).truncated


async def test_sections_split_on_the_sentinel_even_across_chunks() -> None:
    sentinel = new_sentinel().encode()
    assert b"\0" not in sentinel
    stream = b"hello" + sentinel + b'{"seq": 1}\nsecond' + sentinel + b"tail"
    for size in (1, 3, 7, len(stream)):
        reader = asyncio.StreamReader()
        for i in range(0, len(stream), size):
            reader.feed_data(stream[i : i + size])
        reader.feed_eof()
        sections = SectionReader(reader)
        first, second, third = Capture(100), Capture(100), Capture(100)
        assert await sections.section(sentinel, first)
        assert await sections.line() == b'{"seq": 1}'
        assert await sections.section(sentinel, second)
        assert not await sections.section(sentinel, third)  # ends without a sentinel
        assert (bytes(first.data), bytes(second.data), bytes(third.data)) == (
            b"hello",
            b"second",
            b"tail",
        )


async def test_truncated_section_still_finds_its_sentinel() -> None:
    sentinel = new_sentinel().encode()
    reader = asyncio.StreamReader()
    reader.feed_data(b"x" * 100_000 + sentinel + b"next")
    reader.feed_eof()
    cap = Capture(10)
    assert await SectionReader(reader).section(sentinel, cap)
    assert cap.total == 100_000 and bytes(cap.data) == b"x" * 10
