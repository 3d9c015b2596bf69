"""A pool of sandbox servers: checked at start, sessions spread by load, dead ones routed around."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence

from agentloop.errors import ConfigError, SandboxError
from agentloop.sandboxes.base import ExecResult, SandboxLimitError, SandboxLimits
from agentloop.sandboxes.pool_config import (
    DEFAULT_URL,
    TOKEN_ENV,
    URLS_ENV,
    resolve_token,
    resolve_urls,
)
from agentloop.sandboxes.pool_server import PoolServer, PoolSession, describe_caps, read_cap
from agentloop.sandboxes.pool_stats import PoolStats, ServerStats
from agentloop.sandboxes.remote import RemoteSandbox, ServerBusy, ServerUnreachable
from agentloop.sandboxes.shared import shared_sandboxes

__all__ = [
    "DEFAULT_URL",
    "TOKEN_ENV",
    "URLS_ENV",
    "PoolSession",
    "PoolStats",
    "RemotePool",
    "ServerStats",
    "pool_stats",
]

log = logging.getLogger(__name__)

# The id of a session no server has: a DELETE of it answers 404 with a good token, 401 without.
_PROBE_SESSION = "agentloop-token-probe"
_BUSY_BACKOFF_S = 1.0  # a server that answered a session open with 429/503 is skipped this long


class RemotePool:
    """The ``remote`` backend: runs code on one or more ``agentloop serve-sandbox`` servers.

    ``urls`` are the servers' base URLs (a list, or one string of comma-separated URLs); without
    them the URLs come from the environment variable ``urls_env`` (default
    ``$AGENTLOOP_SANDBOX_URLS``), else :data:`DEFAULT_URL`. The bearer token is read from the
    environment variable ``token_env`` (default ``$AGENTLOOP_SANDBOX_TOKEN``, if set), so it never
    sits in a config file; ``token`` passes one directly from Python.

    ``start()`` checks every server (its ``/health`` and the token) and fails naming the one that
    does not answer or rejects the token. A session goes to the up server with the fewest open
    sessions (ties taken in turn) and stays there; one-off runs go to the least busy server.
    Each server allows a client so many sessions (its ``/health`` says how many): at that
    number, or when a server answers an open with 429 (the same token or address used from
    elsewhere), a new session goes to another server or waits for one to close, up to
    ``session_wait_s``, then fails naming the limits; the first wait logs a warning, since it
    means more concurrent episodes than the servers hold sessions. A server that cannot be
    reached is marked down: its sessions' runs raise :class:`SandboxError` naming it (the code
    interpreter turns that into a tool error) and new sessions go to the others.
    ``connect_timeout_s``, ``retries``/``backoff_s`` (connection failures only) and ``grace_s``
    (added to each run's timeout for the request's deadline) set each request's patience;
    ``health_timeout_s`` bounds the start-up check. A down server is probed again after
    ``recheck_s`` (at once when no server is up) and takes new sessions once it answers.
    :meth:`stats` gives per-server metrics.
    """

    name = "remote"

    def __init__(
        self,
        urls: str | Sequence[str] | None = None,
        *,
        urls_env: str | None = None,
        token: str | None = None,
        token_env: str | None = None,
        limits: SandboxLimits | None = None,
        retries: int = 4,
        backoff_s: float = 0.1,
        connect_timeout_s: float = 5.0,
        grace_s: float = 30.0,
        health_timeout_s: float = 10.0,
        recheck_s: float = 10.0,
        session_wait_s: float = 600.0,
    ) -> None:
        self.urls = resolve_urls(urls, urls_env)
        self.token, self.token_source = resolve_token(token, token_env)
        for name, value in (
            ("connect_timeout_s", connect_timeout_s),
            ("grace_s", grace_s),
            ("health_timeout_s", health_timeout_s),
            ("recheck_s", recheck_s),
            ("session_wait_s", session_wait_s),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"remote sandbox {name} must be a number > 0, got {value!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"remote sandbox retries must be an integer >= 0, got {retries!r}")
        self.limits = limits or SandboxLimits()
        self.health_timeout_s = float(health_timeout_s)
        self.recheck_s = float(recheck_s)
        self.session_wait_s = float(session_wait_s)
        self._servers = [
            PoolServer(
                RemoteSandbox(
                    url,
                    token=self.token,
                    limits=self.limits,
                    retries=retries,
                    backoff_s=backoff_s,
                    connect_timeout_s=connect_timeout_s,
                    grace_s=grace_s,
                ),
                i,
            )
            for i, url in enumerate(self.urls)
        ]
        self._turn = -1  # rotates which of equally loaded servers comes first (0: the first)
        self._freed = asyncio.Condition()  # notified when a session closes
        self._waiting = 0
        self._warned = False
        self._started = False
        self._start_lock: asyncio.Lock | None = None

    async def start(self) -> None:
        """Open the clients and check every server; raises ConfigError naming a bad one."""
        if self._started:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._started:
                return
            for server in self._servers:
                await server.client.start()
            try:
                results = await asyncio.gather(
                    *(self._check(s) for s in self._servers), return_exceptions=True
                )
                _raise_in_url_order(results)
            except BaseException:
                await self.close()
                raise
            self._started = True

    async def _check(self, server: PoolServer) -> None:
        url = server.url
        try:
            health = await server.client.health(url, self.health_timeout_s)
        except (SandboxError, TimeoutError) as exc:
            detail = str(exc) or f"no answer within health_timeout_s={self.health_timeout_s:g}"
            raise ConfigError(
                f"sandbox server {url} does not answer ({detail}); check the URL and that "
                "`agentloop serve-sandbox` runs there"
            ) from None
        if health.get("status") not in ("ok", "draining"):
            raise ConfigError(f"sandbox server {url} is not healthy: {health!r}")
        read_cap(server, health)
        try:
            async with asyncio.timeout(self.health_timeout_s):
                await server.client._request(
                    "DELETE", url, f"/v1/sessions/{_PROBE_SESSION}", None, self.health_timeout_s
                )
        except (SandboxError, ConfigError, TimeoutError) as exc:
            text = str(exc)
            if " 404:" in text:  # the probe session does not exist: the token was accepted
                return
            if " 401:" in text:
                raise ConfigError(
                    f"sandbox server {url} rejected the token ({self.token_source}); set the "
                    "token the server was started with (its --token-file or "
                    "$AGENTLOOP_SANDBOX_TOKEN)"
                ) from None
            raise ConfigError(f"sandbox server {url} failed the start-up check: {text}") from None

    async def close(self) -> None:
        self._started = False
        await asyncio.gather(*(s.client.close() for s in self._servers), return_exceptions=True)

    async def __aenter__(self) -> RemotePool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stats(self) -> PoolStats:
        """Per-server metrics: up or down, open sessions, sessions opened, runs and errors."""
        return PoolStats(tuple(s.stats() for s in self._servers), self._waiting)

    async def _revive(self) -> None:
        """Probe the down servers due for it: every ``recheck_s``, or at once when none is up (a
        caller would otherwise fail for sure); bring back those that answer their ``/health``
        (a restarted server). Callers asking at the same time share one probe per server."""
        now = time.monotonic()
        none_up = not any(s.up for s in self._servers)
        due = [
            s
            for s in self._servers
            if not s.up and (none_up or now - s.down_since >= self.recheck_s)
        ]
        if due:
            await asyncio.gather(*(self._probe(s) for s in due))

    async def _probe(self, server: PoolServer) -> None:
        if server.probe is None or server.probe.done():
            server.probe = asyncio.ensure_future(self._check_health(server))
        await asyncio.shield(server.probe)

    async def _check_health(self, server: PoolServer) -> None:
        server.down_since = time.monotonic()
        # a fresh connection pool: the dead server's kept-alive connections are half-open
        await server.client.close()
        await server.client.start()
        try:
            health = await server.client.health(server.url, self.health_timeout_s)
        except (SandboxError, TimeoutError) as exc:
            log.debug("sandbox server %s is still down: %s", server.url, exc)
            return
        read_cap(server, health)
        server.up = True
        log.warning("sandbox server %s answers again; it takes new sessions", server.url)

    async def _by_load(self) -> list[PoolServer]:
        await self._revive()
        up = [s for s in self._servers if s.up]
        if not up:
            down = "; ".join(f"{s.url}: {s.last_error}" for s in self._servers)
            raise SandboxError(f"every sandbox server of the pool is down ({down})")
        self._turn += 1
        n = len(self._servers)
        return sorted(up, key=lambda s: (s.load, (s.index - self._turn) % n))

    def _require_started(self) -> None:
        if not self._started:
            raise SandboxError("remote sandbox is not started; use `async with sandbox:`")

    async def run(
        self,
        code: str,
        *,
        language: str = "python",
        timeout_s: float | None = None,
        stdin: str | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ) -> ExecResult:
        """Run once on the least busy up server; fail over when one cannot be reached."""
        self._require_started()
        while True:
            server = (await self._by_load())[0]
            server.active += 1
            try:
                result = await server.client.run(
                    code, language=language, timeout_s=timeout_s, stdin=stdin, files=files
                )
            except ServerUnreachable as exc:
                server.failed(exc)
                if "cannot connect" not in str(exc):  # it may have run: never re-send
                    raise
                continue
            except SandboxLimitError:  # the caller's input, refused before it was sent
                raise
            except SandboxError as exc:
                server.failed(exc)
                raise
            finally:
                server.active -= 1
            server.runs += 1
            return result

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[PoolSession]:
        """A session on the up server with the fewest open sessions; it stays there."""
        self._require_started()
        deadline = time.monotonic() + self.session_wait_s
        while True:
            server = await self._server_with_room(deadline)
            server.opening += 1
            try:
                opened = server.client.session()
                inner = await opened.__aenter__()
            except ServerUnreachable as exc:  # nothing was opened: try the next server
                server.failed(exc)
                continue
            except ServerBusy as exc:  # at its limit for us (or draining): elsewhere, or wait
                server.busy_until = time.monotonic() + _BUSY_BACKOFF_S
                server.last_error = str(exc)
                continue
            finally:
                server.opening -= 1
            break
        server.active += 1
        server.opened += 1
        try:
            yield PoolSession(server, inner)
        finally:
            try:
                await opened.__aexit__(None, None, None)  # a DELETE; errors suppressed
            finally:
                server.active -= 1
                async with self._freed:
                    self._freed.notify_all()

    async def _server_with_room(self, deadline: float) -> PoolServer:
        """The least loaded up server below its session limit, waiting for one until
        ``deadline`` (a session closing, or a server's 429 backoff running out)."""
        while True:
            servers = await self._by_load()
            now = time.monotonic()
            for server in servers:
                if server.has_room(now):
                    return server
            if now >= deadline:
                raise SandboxError(
                    f"no sandbox server had room for a new session within session_wait_s="
                    f"{self.session_wait_s:g}s ({describe_caps(servers)}); add servers, raise "
                    "serve-sandbox --max-sessions-per-client, or run fewer episodes at once"
                )
            self._warn_waiting(servers)
            backoffs = [s.busy_until - now for s in servers if s.busy_until > now]
            self._waiting += 1
            try:
                async with self._freed:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(min([deadline - now, 1.0, *backoffs])):
                            await self._freed.wait()
            finally:
                self._waiting -= 1

    def _warn_waiting(self, servers: list[PoolServer]) -> None:
        if self._warned:
            return
        self._warned = True
        log.warning(
            "every sandbox server of the pool is at its session limit for this client (%s); "
            "new sessions wait for one to close (up to session_wait_s=%gs). More episodes run "
            "at once than the servers hold sessions: add servers, raise serve-sandbox "
            "--max-sessions-per-client, or lower the rollout concurrency",
            describe_caps(servers),
            self.session_wait_s,
        )


def pool_stats() -> list[PoolStats]:
    """The stats of the remote pools shared on the running event loop (``shared_sandbox``)."""
    return [s.stats() for s in shared_sandboxes() if isinstance(s, RemotePool)]


def _raise_in_url_order(results: list[BaseException | None]) -> None:
    """Every server that failed the start-up check, named in the order of ``urls`` (the checks
    run concurrently, so the first to fail is a race); anything but a ConfigError as it is."""
    errors = [r for r in results if isinstance(r, BaseException)]
    for error in errors:
        if not isinstance(error, ConfigError):
            raise error
    if errors:
        raise ConfigError("; ".join(str(e) for e in errors))
