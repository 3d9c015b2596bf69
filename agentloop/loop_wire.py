"""The driver and its loop workers' wire (:mod:`agentloop.loop_workers`): the messages, and the
channel of framed pickles they travel on over a socket pair."""

from __future__ import annotations

import asyncio
import pickle
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentloop.engines.base import SamplingParams
from agentloop.errors import InferenceError
from agentloop.types import Completion, Task, Trajectory, pickled_as_tuple

__all__ = [
    "Broken",
    "Cancel",
    "Channel",
    "Generate",
    "Generated",
    "Play",
    "Played",
    "Ready",
    "Start",
    "open_channel",
]

HEADER_BYTES = 8  # a frame's length
FRAME_MESSAGES = 32  # messages at most per frame


# -- driver -> worker ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Start:
    """The worker's first message: its setup, pickled here (a setup that cannot be pickled is
    the driver's error, at once; one that cannot be unpickled there is the worker's ``Broken``)."""

    setup: bytes


@pickled_as_tuple
@dataclass(frozen=True, slots=True)
class Play:
    """Play sample ``index`` of ``task`` in a batch seeded ``seed``, as episode ``job``."""

    job: int
    task: Task
    index: int
    seed: int


@dataclass(frozen=True, slots=True)
class Cancel:
    """Episode ``job``'s batch was cancelled: stop it."""

    job: int


@pickled_as_tuple
@dataclass(frozen=True, slots=True)
class Generated:
    """The engine's answer to request ``request``: a completion, or the error it raised."""

    request: int
    completion: Completion | None
    error: InferenceError | None = None


# -- worker -> driver ------------------------------------------------------------------
@pickled_as_tuple
@dataclass(frozen=True, slots=True)
class Generate:
    """An episode's engine call, as ``Engine.generate`` takes it."""

    request: int
    prompt_ids: Sequence[int]
    sampling: SamplingParams
    session_id: str | None
    images: Sequence[Any]


@dataclass(frozen=True, slots=True)
class Ready:
    """The worker has its env factory and builder: it takes episodes now."""


@dataclass(frozen=True, slots=True)
class Broken:
    """The worker cannot start (its setup does not unpickle, its env cannot be made): why."""

    reason: str


@pickled_as_tuple
@dataclass(frozen=True, slots=True)
class Played:
    """Episode ``job`` ended: its trajectories."""

    job: int
    trajectories: list[Trajectory]


class Channel:
    """Framed pickles over a stream. Messages sent within one event-loop tick share a frame, up
    to ``FRAME_MESSAGES`` of them: a frame as large as a whole wave of episodes would make the
    two sides take turns (one busy while the other waits for the frame) instead of overlapping."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._outbox: list[object] = []

    def send(self, message: object) -> None:
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(message)
        if len(self._outbox) >= FRAME_MESSAGES:
            self._flush()

    def _flush(self) -> None:
        if not self._outbox:
            return
        frame = pickle.dumps(self._outbox, protocol=pickle.HIGHEST_PROTOCOL)
        self._outbox = []
        if not self._writer.is_closing():
            self._writer.write(len(frame).to_bytes(HEADER_BYTES, "little") + frame)

    async def receive(self) -> list[object]:
        """The next frame's messages; ``asyncio.IncompleteReadError`` once the peer is gone."""
        size = int.from_bytes(await self._reader.readexactly(HEADER_BYTES), "little")
        messages: list[object] = pickle.loads(await self._reader.readexactly(size))
        return messages

    async def drain(self) -> None:
        """Send what waits in the outbox now, and wait until it is written."""
        self._flush()
        await self._writer.drain()

    def close(self) -> None:
        self._writer.close()


async def open_channel(sock: socket.socket) -> Channel:
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=2**26)
    return Channel(reader, writer)
