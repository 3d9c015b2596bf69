"""One server of a remote sandbox pool as the pool sees it, and a session bound to it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from agentloop.errors import SandboxError
from agentloop.sandboxes.base import ExecResult, SandboxLimitError
from agentloop.sandboxes.pool_stats import ServerStats
from agentloop.sandboxes.remote import RemoteSandbox, RemoteSession, ServerUnreachable

__all__ = ["PoolServer", "PoolSession", "describe_caps", "read_cap"]

log = logging.getLogger("agentloop.sandboxes.remote_pool")


class PoolServer:
    """A pool's view of one server: its client and counters."""

    def __init__(self, client: RemoteSandbox, index: int) -> None:
        self.client = client
        self.url = client.urls[0]
        self.index = index
        self.up = True
        self.cap: int | None = None  # its sessions per client (/health), if it says
        self.busy_until = 0.0  # after a 429/503 to a session open: skipped until then
        self.opening = 0
        self.active = 0
        self.opened = 0
        self.runs = 0
        self.errors = 0
        self.last_error: str | None = None
        self.down_since = 0.0
        self.probe: asyncio.Future[None] | None = None  # the /health probe in flight, if any

    def failed(self, exc: SandboxError) -> None:
        self.errors += 1
        self.last_error = str(exc)
        if isinstance(exc, ServerUnreachable) and self.up:
            self.up, self.down_since = False, time.monotonic()
            log.warning("sandbox server %s is down; new sessions go elsewhere: %s", self.url, exc)

    @property
    def load(self) -> int:
        """Sessions open and being opened."""
        return self.active + self.opening

    def has_room(self, now: float) -> bool:
        return (self.cap is None or self.load < self.cap) and now >= self.busy_until

    def stats(self) -> ServerStats:
        return ServerStats(
            self.url,
            self.up,
            self.active,
            self.opened,
            self.runs,
            self.errors,
            self.last_error,
            self.cap,
        )


class PoolSession:
    """A session of a :class:`RemotePool`, bound to one server; counts its runs and errors."""

    def __init__(self, server: PoolServer, inner: RemoteSession) -> None:
        self._server = server
        self._inner = inner
        self.id = inner.id
        self.server = server.url

    async def run(
        self,
        code: str,
        *,
        language: str = "python",
        timeout_s: float | None = None,
        stdin: str | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ) -> ExecResult:
        server = self._server
        if not server.up:
            raise SandboxError(
                f"sandbox server {server.url} is down ({server.last_error}); this session's "
                "state is lost with it"
            )
        try:
            result = await self._inner.run(
                code, language=language, timeout_s=timeout_s, stdin=stdin, files=files
            )
        except SandboxLimitError:  # the caller's input, refused before it was sent
            raise
        except SandboxError as exc:
            server.failed(exc)
            raise
        server.runs += 1
        return result


def read_cap(server: PoolServer, health: Mapping[str, object]) -> None:
    cap = health.get("max_sessions_per_client")
    server.cap = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None


def describe_caps(servers: list[PoolServer]) -> str:
    return ", ".join(
        f"{s.url}: {s.load} open of {s.cap if s.cap is not None else '?'}"
        + (" (answered 429)" if s.busy_until > time.monotonic() else "")
        for s in servers
    )
