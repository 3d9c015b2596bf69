"""Admission to the sandbox server: run slots with a bounded queue, and session caps that hold
under a burst of concurrent opens."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Iterator

from aiohttp import web

__all__ = ["RunGate", "SessionCaps", "too_many"]


def too_many(kind: str, message: str, **headers: str) -> web.HTTPTooManyRequests:
    """A 429 to raise, with the server's JSON error body."""
    text = json.dumps({"error": message, "type": kind})
    return web.HTTPTooManyRequests(text=text, content_type="application/json", headers=headers)


class RunGate:
    """At most ``limit`` runs at once and ``queue`` waiting; beyond that, 429 + Retry-After."""

    def __init__(self, limit: int, queue: int) -> None:
        self.limit, self.queue = limit, queue
        self._sem = asyncio.Semaphore(limit)
        self.active = 0
        self.waiting = 0

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self._sem.locked() and self.waiting >= self.queue:
            raise too_many(
                "Busy", "sandbox server is at capacity; retry later", **{"Retry-After": "1"}
            )
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            self._sem.release()


class SessionCaps:
    """At most ``total`` sessions, ``per_client`` per client, counting the open ones (whose
    owners the caller passes) and those held here: being opened, or living for one request
    (SandboxFusion's ``fetch_files``)."""

    def __init__(self, total: int, per_client: int) -> None:
        self.total, self.per_client = total, per_client
        self._held: collections.Counter[str] = collections.Counter()

    @contextlib.contextmanager
    def hold(self, client: str, open_owners: Iterable[str]) -> Iterator[None]:
        """Count one more session of ``client`` while the block runs, or raise 429 over a cap.
        The check and the count happen with nothing awaited in between, so concurrent opens
        waiting for a run slot cannot overshoot a cap."""
        owners = [*open_owners, *self._held.elements()]
        if len(owners) >= self.total:
            raise too_many("Busy", f"{self.total} sessions open", **{"Retry-After": "1"})
        mine = owners.count(client)
        if mine >= self.per_client:
            raise too_many(
                "TooManySessions",
                f"this client has {mine} sessions open, the server's limit per client "
                f"(--max-sessions-per-client {self.per_client}); close some first",
            )
        self._held[client] += 1
        try:
            yield
        finally:
            self._held[client] -= 1
            if not self._held[client]:
                del self._held[client]
