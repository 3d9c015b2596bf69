"""A loop worker process (:mod:`agentloop.loop_workers`): it plays the episodes the driver deals
out, asking the driver's engine for every completion."""

from __future__ import annotations

import asyncio
import gc
import itertools
import pickle
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentloop.chat import TokenBuilder
from agentloop.collect import YOUNG_GC_PER_EPISODE, EnvFactory, play_one, resolve_env, rollout_gc
from agentloop.engines.base import SamplingParams
from agentloop.errors import InferenceError
from agentloop.loop_wire import (
    Broken,
    Cancel,
    Channel,
    Generate,
    Generated,
    Play,
    Played,
    Ready,
    Start,
    open_channel,
)
from agentloop.rollout import RolloutConfig
from agentloop.types import Completion

__all__ = ["Setup", "worker_main"]


@dataclass(frozen=True)
class Setup:
    """What a worker is started with."""

    env: str | EnvFactory
    env_kwargs: Mapping[str, Any]
    builder: TokenBuilder
    config: RolloutConfig
    supports_images: bool


# -- the worker side -------------------------------------------------------------------------
class _EngineClient:
    """The Engine a worker's episodes see: each request is answered by the main process's."""

    def __init__(self, channel: Channel, supports_images: bool) -> None:
        self._channel, self._images = channel, supports_images
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future[Generated]] = {}

    @property
    def supports_images(self) -> bool:
        return self._images

    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[Any] = (),
    ) -> Completion:
        request = next(self._ids)
        answer: asyncio.Future[Generated] = asyncio.get_running_loop().create_future()
        self._waiting[request] = answer
        self._channel.send(Generate(request, prompt_ids, sampling, session_id, tuple(images)))
        try:
            reply = await answer
        finally:
            self._waiting.pop(request, None)
        if reply.completion is None:
            raise reply.error or InferenceError("the engine returned nothing")
        return reply.completion

    def answer(self, reply: Generated) -> None:
        waiting = self._waiting.get(reply.request)
        if waiting is not None and not waiting.done():  # gone: its episode was cancelled
            waiting.set_result(reply)


def worker_main(sock: socket.socket) -> None:
    """A worker process: play what the main process deals out until it stops or is gone."""
    asyncio.run(_work(sock))


async def _work(sock: socket.socket) -> None:
    channel = await open_channel(sock)
    try:
        (start,) = await channel.receive()
        assert isinstance(start, Start)
        setup: Setup = pickle.loads(start.setup)
        factory = resolve_env(setup.env, setup.env_kwargs, setup.builder)
    except (asyncio.IncompleteReadError, ConnectionError):
        return  # the main process is gone
    except Exception as exc:  # told to the main process, which names it in its error
        channel.send(Broken(f"{type(exc).__name__}: {exc}"))
        await channel.drain()
        channel.close()
        return
    engine = _EngineClient(channel, setup.supports_images)
    running: dict[int, asyncio.Task[None]] = {}
    channel.send(Ready())

    async def play(message: Play) -> None:
        trajectories = await play_one(
            factory, engine, setup.builder, message.task, setup.config, message.index, message.seed
        )
        running.pop(message.job, None)
        channel.send(Played(message.job, trajectories))

    with rollout_gc(episodes=1):  # the heap frozen; young collections spaced as episodes arrive
        while True:
            try:
                messages = await channel.receive()
            except (asyncio.IncompleteReadError, ConnectionError):
                break  # the main process is gone
            for message in messages:
                if isinstance(message, Generated):
                    engine.answer(message)
                elif isinstance(message, Play):
                    running[message.job] = asyncio.create_task(play(message))
                    _space_young_collections(len(running))
                elif isinstance(message, Cancel) and message.job in running:
                    running.pop(message.job).cancel()
    channel.close()  # asyncio.run cancels what still runs, and each episode closes its env


def _space_young_collections(running: int) -> None:
    """Space young GC collections by the episodes this worker runs, as ``collect`` does for a
    batch (:func:`agentloop.collect.rollout_gc`); doubled when outgrown, never lowered."""
    young, *older = gc.get_threshold()
    wanted = YOUNG_GC_PER_EPISODE * running
    if 0 < young < wanted:
        gc.set_threshold(2 * wanted, *older)
