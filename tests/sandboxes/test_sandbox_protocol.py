"""Kernel protocol pieces: sentinel sections across chunk boundaries, capped capture, bounded
buffers for a drained transport (the docker backend's attach socket)."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import tracemalloc
from collections.abc import Iterable
from types import SimpleNamespace

from agentloop.sandboxes.docker import DockerKernel, FrameSplitter
from agentloop.sandboxes.protocol import (
    Capture,
    SectionBuffer,
    SectionMarks,
    SectionReader,
    Sections,
    new_key,
)


def test_capture_keeps_the_head_and_counts_the_rest() -> None:
    cap = Capture(5)
    for chunk in (b"abc", b"defg", b"h"):
        cap.add(chunk)
    assert bytes(cap.data) == b"abcde" and cap.total == 8 and cap.truncated
    assert Capture(5).text() == "" and not Capture(5).truncated


async def test_sections_split_on_the_sentinel_even_across_chunks() -> None:
    marks = SectionMarks(new_key())
    assert b"\0" not in marks(0) and marks(0) != marks(1)
    stream = b"hello" + marks(0) + b'{"seq": 1}\nsecond' + marks(1) + b'{"seq": 2}\ntail'
    for size in (1, 3, 7, len(stream)):
        reader = asyncio.StreamReader()
        for i in range(0, len(stream), size):
            reader.feed_data(stream[i : i + size])
        reader.feed_eof()
        pulled = SectionReader(reader, marks)
        pushed = SectionBuffer(marks, 100, status_line=True)
        for i in range(0, len(stream), size):
            pushed.feed(stream[i : i + size])
        pushed.feed_eof()
        for sections in (pulled, pushed):
            assert await _three(sections) == (b"hello", b"second", b"tail")


async def _three(sections: Sections) -> tuple[bytes, bytes, bytes]:
    first, second, third = Capture(100), Capture(100), Capture(100)
    assert await sections.section(first)
    assert await sections.line() == b'{"seq": 1}'
    assert await sections.section(second)
    assert await sections.line() == b'{"seq": 2}'
    assert not await sections.section(third)  # ends without a sentinel
    return bytes(first.data), bytes(second.data), bytes(third.data)


async def test_truncated_section_still_finds_its_sentinel() -> None:
    marks = SectionMarks(new_key())
    sentinel = marks(0)
    reader = asyncio.StreamReader()
    reader.feed_data(b"x" * 100_000 + sentinel + b"next")
    reader.feed_eof()
    pushed = SectionBuffer(marks, 10)
    pushed.feed(b"x" * 100_000 + sentinel + b"next")
    for sections in (SectionReader(reader, marks), pushed):
        cap = Capture(10)
        assert await sections.section(cap)
        assert cap.total == 100_000 and bytes(cap.data) == b"x" * 10


def test_frames_are_split_as_bytes_arrive() -> None:
    frames = [(1, b"out"), (2, b""), (2, b"err" * 1000), (1, b"x")]
    stream = b"".join(struct.pack(">BxxxI", k, len(d)) + d for k, d in frames)
    for size in (1, 5, 8, 9, 4096):
        splitter, got = FrameSplitter(), {1: b"", 2: b""}
        for i in range(0, len(stream), size):
            for kind, piece in splitter.split(stream[i : i + size]):
                assert len(piece) <= size
                got[kind] += piece
        assert got == {1: b"outx", 2: b"err" * 1000}


async def test_unread_sections_are_bounded_in_number_and_size() -> None:
    marks = SectionMarks(new_key())
    sections = SectionBuffer(marks, 16)
    for i in range(100):  # nobody reads: only the last few sections are kept, each capped
        sections.feed(b"%d:" % i + b"y" * 1000 + marks(i))
    cap = Capture(16)
    assert await sections.section(cap)
    assert cap.total == len(b"96:") + 1000 and bytes(cap.data).startswith(b"96:")


def _frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(data)) + data


async def test_docker_kernel_drains_and_drops_output_nobody_reads() -> None:
    """100 MB written to the attach socket while no run reads it (output after a run ended)
    leave the host's memory alone: the socket is drained, what exceeds the cap is counted."""
    key = new_key()
    marks = SectionMarks(key)
    host, engine = socket.socketpair()
    client = SimpleNamespace(api=SimpleNamespace(kill=lambda cid: None, wait=lambda cid: {}))
    client.api.remove_container = lambda cid, force: None
    chunk = b"z" * (1 << 20)

    def container(frames: Iterable[bytes]) -> None:
        for frame in frames:
            engine.sendall(frame)

    ready = [
        _frame(1, marks(0)),
        _frame(2, marks(0) + json.dumps({"seq": 0, "ready": True}).encode()),
    ]
    tracemalloc.start()
    try:
        kernel = DockerKernel(client, "cid", host, key, 64 << 10)
        writer = threading.Thread(target=container, args=([*ready, _frame(2, b"\n")],))
        writer.start()
        await kernel.handshake(30)
        writer.join()
        tracemalloc.reset_peak()
        async with asyncio.timeout(60):  # the engine's writes all go through unread
            await asyncio.to_thread(container, (_frame(1, chunk) for _ in range(100)))
            engine.sendall(_frame(1, marks(1)))
            out = Capture(64 << 10)
            assert await kernel._out.section(out)
        peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
        engine.close()
    await kernel.close()
    assert out.total == 100 << 20 and len(out.data) == 64 << 10
    assert peak_mb < 8, f"the host held {peak_mb:.0f} MB of 100 MB written after a run"


async def test_only_the_next_mark_ends_a_section() -> None:
    """Marks are per kernel and per section: an old mark, another kernel's or the next one
    (which code cannot compute without the key) is output, not the end of the run."""
    marks, other = SectionMarks(new_key()), SectionMarks(new_key())
    forged = other(0) + marks(1)
    stream = b"a" + forged + b"b" + marks(0) + b"c" + marks(0) + b"d" + marks(1)
    reader = asyncio.StreamReader()
    reader.feed_data(stream)
    pushed = SectionBuffer(marks, 1000)
    pushed.feed(stream)
    for sections in (SectionReader(reader, marks), pushed):
        first, second = Capture(1000), Capture(1000)
        assert await sections.section(first) and await sections.section(second)
        assert bytes(first.data) == b"a" + forged + b"b"
        assert bytes(second.data) == b"c" + marks(0) + b"d"
