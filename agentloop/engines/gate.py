"""WeightGate: orders generation requests and weight updates so every token's version is known."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from agentloop.engines.base import SamplingParams
from agentloop.errors import InferenceError
from agentloop.types import Completion

__all__ = ["WeightGate", "resumable"]

_POLL_S = 0.05  # how often an interrupting update re-sends its aborts (see update)


class WeightGate:
    """The bookkeeping that lets an engine tag each sampled token with its policy version.

    A request calls :meth:`admit` before it is sent to the engine (it waits while an update runs,
    and learns the version and update epoch it runs under) and :meth:`finished` when its call
    returns. A weight update runs inside :meth:`update`: no request is admitted any more, and
    before the new weights are loaded every admitted request has returned, either

    - interrupted: ``abort`` (the engine's abort of every admitted request) is sent, and sent
      again every 50 ms for requests that were still on their way into the engine, until all
      have returned; :meth:`interrupted` then tells their owners to resume them under the new
      weights with the tokens sampled so far; or
    - drained (``abort`` None): the update waits until the running requests have finished.

    Either way all tokens of one engine call come from the weights of the version it was
    admitted under. Every wait ends after ``timeout_s`` with an :class:`InferenceError`.
    """

    def __init__(self, timeout_s: float, version: int = 0) -> None:
        self.timeout_s = timeout_s
        self.version = version
        self.epoch = 0  # counts updates that interrupted running requests
        self._open = asyncio.Event()
        self._open.set()
        self._changed = asyncio.Event()
        self._running = 0

    @property
    def running(self) -> int:
        """Requests admitted whose engine call has not returned yet."""
        return self._running

    async def admit(self) -> tuple[int, int]:
        """Wait until no update runs; returns ``(version, epoch)`` for the new request."""
        if not self._open.is_set():
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self._open.wait()
            except TimeoutError:
                raise InferenceError(
                    f"a weight update held new requests back for more than {self.timeout_s} s; "
                    "the update is stuck (raise vllm.weight_sync_timeout_s if it is just slow)"
                ) from None
        self._running += 1
        return self.version, self.epoch

    def finished(self) -> None:
        self._running -= 1
        self._changed.set()

    def interrupted(self, epoch: int) -> bool:
        """Whether an interrupting update happened since a request admitted at ``epoch``."""
        return self.epoch != epoch

    @contextlib.asynccontextmanager
    async def update(
        self, abort: Callable[[], Awaitable[None]] | None = None
    ) -> AsyncIterator[bool]:
        """Hold requests back for a weight update, and yield once none is running; yields
        whether running requests were interrupted. Updates must not overlap."""
        if not self._open.is_set():
            raise InferenceError(
                "update_weights was called while another weight update runs; await the first"
            )
        self._open.clear()
        try:
            interrupt = abort is not None and self._running > 0
            if interrupt:
                self.epoch += 1
            await self._wait_idle(abort if interrupt else None)
            yield interrupt
        finally:
            self._open.set()

    async def _wait_idle(self, abort: Callable[[], Awaitable[None]] | None) -> None:
        what = "interrupted requests to return" if abort else "running requests to finish"
        try:
            async with asyncio.timeout(self.timeout_s):
                while self._running:
                    self._changed.clear()
                    if abort is None:
                        await self._changed.wait()
                        continue
                    await abort()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), _POLL_S)
        except TimeoutError:
            raise InferenceError(
                f"a weight update waited more than {self.timeout_s} s for {what}"
                + ("" if abort else "; interrupt them instead (update_weights(interrupt=True))")
            ) from None


async def resumable(
    gate: WeightGate,
    sampling: SamplingParams,
    run: Callable[[list[int], SamplingParams], Awaitable[Completion]],
) -> Completion:
    """One request under ``gate``: ``run(sampled, sampling)`` samples after the prompt and the
    tokens ``sampled`` so far. An update that interrupts it (``finish_reason`` "abort") has it
    run again under the new weights with the remaining ``max_tokens``; the completion tags each
    token with the version that sampled it."""
    ids: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    while True:  # more than once only when a weight update interrupts the request
        version, epoch = await gate.admit()
        try:
            part = await run(ids, sampling.with_(max_tokens=sampling.max_tokens - len(ids)))
        finally:
            gate.finished()
        ids += part.token_ids
        logprobs += part.logprobs
        versions += [version] * len(part.token_ids)
        resume = part.finish_reason == "abort" and gate.interrupted(epoch)
        if not resume:
            return Completion(tuple(ids), tuple(logprobs), part.finish_reason, tuple(versions))
        if len(ids) >= sampling.max_tokens:
            return Completion(tuple(ids), tuple(logprobs), "length", tuple(versions))
