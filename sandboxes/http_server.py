"""The aiohttp transport agentloop's servers share: request timeouts, a connection cap, quiet logs.

The sandbox server (``agentloop serve-sandbox``), the retrieval server (``agentloop
serve-search``) and the agent proxy (``agentloop serve-proxy``) listen through
:class:`HttpServer`, configured by :class:`~agentloop.sandboxes.http_limits.HttpLimits`
(``--header-timeout-s``, ``--body-timeout-s``, ``--max-connections``, ``--log-per-minute``).

Why it lives in ``agentloop.sandboxes``: ``sandboxes/server.py`` needs it, and so do
``tools/search_server.py`` and ``agentloop/proxy/server.py``; dependencies point ``sandboxes →
tools → envs → core``, so the leftmost package is the one place all of them may import from. It
imports nothing of agentloop but ``agentloop.errors`` (the floor), so it adds no edge to the
layering, and the floor itself (``types.py``, ``errors.py``) stays free of aiohttp.

What it guards against (a client that opens connections and never finishes a request):

- *Header timeout*: a connection must send a complete request head within
  ``header_timeout_s`` of opening (or of its previous response); otherwise it is closed. This is
  aiohttp's keep-alive timer, which also runs from the moment a connection opens.
- *Body timeout*: a request's body must arrive within ``body_timeout_s`` of its head, or the
  client gets ``408`` (JSON) and the connection is closed. The body is read (once, cached by
  aiohttp) before the handler runs.
- *Connection cap*: at ``max_connections`` open connections (default 2048), a new one
  replaces the oldest connection that has never completed a request (a half-open or slow
  client, one still trickling its body included), else the longest-idle keep-alive one; when
  every connection is busy with a request the newcomer gets ``503`` and is closed. Requests whose
  body is in and that are being served are never cut. The cap is fitted
  to ``RLIMIT_NOFILE`` (raised when allowed), so ``accept()`` never runs out of descriptors.
- *Rate-limited logs*: each message (per logger and format string) is logged at most
  ``log_per_minute`` times a minute, then a count of what was suppressed. This covers
  ``asyncio`` (``socket.accept() out of system resource``) and ``aiohttp``'s loggers, which
  otherwise log one traceback per event.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import resource
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from agentloop.errors import ConfigError
from agentloop.sandboxes.http_limits import HttpLimits, limit_logging

__all__ = [
    "HttpServer",
    "check_port_free",
    "internal_error",
    "listen_error",
    "return_big_buffers",
]

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_FD_RESERVE = 256  # descriptors kept for everything but client connections (files, sandboxes)
_DEFAULT_MAX_CONNECTIONS = 2048
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
)


def listen_error(host: str, port: int, exc: OSError) -> ConfigError:
    """The error for a server that cannot listen on ``host:port``, naming the fix."""
    if exc.errno == errno.EADDRINUSE:
        why = (
            "the port is in use by another process; pass another --port (0 picks a free one), "
            f"or stop the process that listens there (`ss -ltnp 'sport = :{port}'` shows it)"
        )
    else:
        why = f"{exc.strerror or exc}; check --host and --port"
    return ConfigError(f"cannot listen on {host}:{port}: {why}")


def check_port_free(host: str, port: int) -> None:
    """Fail now, with :func:`listen_error`, if ``host:port`` cannot be listened on: for a
    server that has minutes of work (an engine to load) before it listens. Binds as asyncio
    does (``SO_REUSEADDR``), so a port left in ``TIME_WAIT`` passes."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}; check --host") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise listen_error(host, port, exc) from None


# ---------------------------------------------------------------------- connections
@dataclass(slots=True)
class _Conn:
    """What the cap needs to know of one connection."""

    created: float
    last_active: float
    busy: int = 0  # requests whose head and body are in and that run now: never evicted
    reading: int = 0  # requests whose head is in and whose body is still arriving
    served: int = 0


class _Refuse(asyncio.Protocol):
    """Answers a connection over the cap with 503 and closes it (nothing is read)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        body = b'{"error": "server is at its connection limit; retry later", "type": "Busy"}'
        assert isinstance(transport, asyncio.Transport)
        transport.write(_REFUSED % (len(body), body))
        transport.close()


class _CappedSite(web.BaseSite):
    """A TCP site whose connections come from ``factory`` (the cap) instead of the runner."""

    __slots__ = ("_factory", "_host", "_port")

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, factory: Callable[[], Any]
    ) -> None:
        super().__init__(runner)
        self._host, self._port, self._factory = host, port, factory

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._factory, self._host, self._port, backlog=self._backlog
        )
        self._port = self._server.sockets[0].getsockname()[1]


class HttpServer:
    """Serves an aiohttp ``app`` on ``host:port`` within ``limits``.

    Adds one innermost middleware to ``app`` (so call this before the app is started): it
    reads the request body under ``body_timeout_s`` and marks the connection busy while its
    request runs, so the cap never drops it. ``loggers`` names the app's own loggers, which are
    rate-limited like aiohttp's.
    """

    def __init__(
        self,
        app: web.Application,
        limits: HttpLimits | None = None,
        *,
        loggers: Iterable[str] = (),
        shutdown_timeout_s: float = 5.0,
    ) -> None:
        if app.frozen:
            raise ConfigError("HttpServer needs an application that has not been started yet")
        self.app, self.limits = app, limits or HttpLimits()
        self.port: int | None = None
        self._loggers = tuple(loggers)
        self._shutdown_timeout_s = shutdown_timeout_s
        self._conns: dict[RequestHandler, _Conn] = {}
        self._runner: web.AppRunner | None = None
        self.max_connections = 0  # the cap in force: set by start() (the default fits ulimit)
        self.refused = 0  # connections answered 503 (all busy)
        self.evicted = 0  # half-open or idle connections closed to make room
        app.middlewares.append(self._guard)

    @property
    def connections(self) -> int:
        """Connections open now (those made room for excluded)."""
        live = set(self._runner.server.connections) if self._runner and self._runner.server else ()
        return sum(1 for h in self._conns if h in live)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on ``host:port`` (0: a free port); returns the port."""
        self.max_connections = _fit_fd_limit(self.limits.max_connections)
        limit_logging(self.limits.log_per_minute, self._loggers)
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            keepalive_timeout=self.limits.header_timeout_s,
            shutdown_timeout=self._shutdown_timeout_s,
        )
        await self._runner.setup()
        site = _CappedSite(self._runner, host, port, self._protocol)
        try:
            await site.start()
        except OSError as exc:
            await self.stop()
            raise listen_error(host, port, exc) from None
        self.port = site._port
        return self.port

    async def stop(self) -> None:
        """Close every connection and stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._conns.clear()

    def _protocol(self) -> asyncio.BaseProtocol:
        """A protocol for a new connection, making room under the cap first."""
        assert self._runner is not None and self._runner.server is not None
        now = time.monotonic()
        if len(self._conns) >= self.max_connections and not self._make_room(now):
            self.refused += 1
            log.warning(
                "connection limit (%d) reached with every connection busy; refusing with 503",
                self.max_connections,
            )
            return _Refuse()
        handler = self._runner.server()
        self._conns[handler] = _Conn(now, now)
        # our own header timer for the first request: aiohttp's keep-alive timer runs from a
        # connection's opening only in its newest releases
        loop = asyncio.get_running_loop()
        loop.call_later(self.limits.header_timeout_s, self._first_request_due, handler)
        return handler

    def _first_request_due(self, handler: RequestHandler) -> None:
        """Close a connection that has not sent a whole request head within the header timeout."""
        conn = self._conns.get(handler)
        if conn is not None and not (conn.busy or conn.reading or conn.served):
            handler.force_close()
            del self._conns[handler]

    def _make_room(self, now: float) -> bool:
        """Forget closed connections; if still at the cap, close the oldest never-served one,
        else the longest-idle one. False when every connection is busy with a request.

        ``_conns`` is in opening order, so the scan usually stops within the first few entries:
        cheap per accept even at the cap under a flood.
        """
        closed, victim = [], None
        for h, c in self._conns.items():
            # aiohttp drops the transport when the connection is lost; a handler this factory
            # just made has none yet either (connection_made comes a moment later).
            if h.transport is None and now - c.created > 1.0:
                closed.append(h)
            elif not c.busy and not c.served:
                victim = h
                break
        for h in closed:
            del self._conns[h]
        if len(self._conns) < self.max_connections:
            return True
        if victim is None:
            idle = [(c.last_active, h) for h, c in self._conns.items() if not c.busy]
            if not idle:
                return False
            victim = min(idle, key=lambda e: e[0])[1]
        victim.force_close()
        del self._conns[victim]
        self.evicted += 1
        return True

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = self._conns.get(request.protocol)
        if request.body_exists:
            if conn is not None:
                conn.reading += 1
            try:
                async with asyncio.timeout(self.limits.body_timeout_s):
                    await request.read()  # cached: the handler's read()/json() reuse it
            except TimeoutError:
                return await _timed_out(request, self.limits.body_timeout_s)
            except (ConnectionResetError, RuntimeError) as exc:
                if not _closed_mid_body(exc):
                    raise
                # the client left mid-body, or the cap closed it: no one to answer
                request.protocol.force_close()
                return web.Response(status=400)
            finally:
                if conn is not None:
                    conn.reading -= 1
        # Busy (never closed to make room) only once the whole request is in: a client that
        # trickles its body stays evictable like a half-open one.
        if conn is not None:
            conn.busy += 1
        try:
            return await handler(request)
        finally:
            if conn is not None:
                conn.busy -= 1
                conn.served += 1
                conn.last_active = time.monotonic()


def _closed_mid_body(exc: BaseException) -> bool:
    """Whether reading a body failed because its connection went away: a reset (the client
    left; the cap's close, seen once the connection is lost), or aiohttp's (3.x)
    ``RuntimeError("Connection closed.")``, which a read that resumes between the cap's close
    and the loss of the connection gets. Any other RuntimeError is a bug, not a client's."""
    if isinstance(exc, ConnectionResetError):
        return True
    return type(exc) is RuntimeError and exc.args == ("Connection closed.",)


async def _timed_out(request: web.Request, seconds: float) -> web.Response:
    """A 408 (JSON), sent now; then the connection is closed at once rather than lingering to
    read the rest of a body that is not coming."""
    resp = web.json_response(
        {
            "error": f"the request body did not arrive within {seconds:g} s; send it faster "
            "(the server's --body-timeout-s)",
            "type": "Timeout",
        },
        status=408,
    )
    resp.force_close()
    await resp.prepare(request)
    await resp.write_eof()
    request.protocol.force_close()
    return resp


def internal_error(request: web.Request, exc: Exception, logger: logging.Logger) -> web.Response:
    """What a server's outermost middleware answers for an exception no handler expected: a
    JSON 500 (``{"error", "type": "InternalError"}``, no traceback), logged here once with its
    traceback (through ``logger``, which :class:`HttpServer` rate-limits when it is one of its
    ``loggers``), so aiohttp neither answers in plain text nor logs it again."""
    logger.error("unexpected error serving %s %s", request.method, request.path, exc_info=exc)
    name = type(exc).__name__
    message = f"internal error ({name}) serving {request.method} {request.path}; see the server log"
    return web.json_response({"error": message, "type": "InternalError"}, status=500)


def _fit_fd_limit(requested: int | None) -> int:
    """The connection cap, with the soft descriptor limit raised to fit it when allowed; a cap
    the hard limit cannot fit is lowered when it is the default, else a ConfigError."""
    cap = requested or _DEFAULT_MAX_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    need = cap + _FD_RESERVE
    if soft == infinite or soft >= need:
        return cap
    if hard == infinite or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return cap
    if requested is not None:
        raise ConfigError(
            f"--max-connections {requested} needs {need} file descriptors but this process may "
            f"open {hard} at most (ulimit -Hn); lower --max-connections to "
            f"{max(1, hard - _FD_RESERVE)} or raise the limit"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cap = max(1, hard - _FD_RESERVE)
    log.info("at most %d connections: the descriptor limit (ulimit -Hn) is %d", cap, hard)
    return cap


def return_big_buffers(threshold: int = 256 << 10) -> bool:
    """Have glibc serve every allocation of ``threshold`` bytes or more from a mapping of its
    own, unmapped when freed. A server's big bodies and answers (a run's 1 MB output is copied a
    few times on its way out) then go back to the system once sent instead of staying in the
    heap, where glibc's adaptive threshold otherwise puts them. False where the C library has
    no ``mallopt`` (not glibc); nothing changes then."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
