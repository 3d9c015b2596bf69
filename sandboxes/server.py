"""The sandbox server: a backend over HTTP; auth, back-pressure, sessions, SandboxFusion API."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agentloop.errors import ConfigError, SandboxError
from agentloop.sandboxes.admission import RunGate, SessionCaps
from agentloop.sandboxes.base import ExecResult, Sandbox, SandboxLimits, SandboxSession
from agentloop.sandboxes.http_limits import HttpLimits, http_limits_from_args
from agentloop.sandboxes.http_server import HttpServer, internal_error, return_big_buffers
from agentloop.sandboxes.serve_args import (
    backend_kwargs_from_args,
    build_parser,
    is_loopback,
    read_tokens,
    warn_open,
)
from agentloop.sandboxes.tiers import LimitsFactory, MemoryTiers
from agentloop.sandboxes.wire import (
    FusionRequest,
    RunRequest,
    cap_output,
    fetch_code,
    parse_fetched,
    parse_run_request,
    sandboxfusion_request,
    sandboxfusion_response,
)

__all__ = [
    "SandboxServer",
    "backend_kwargs_from_args",
    "build_parser",
    "main",
    "run_from_args",
    "serve",
]

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_CLIENT = web.RequestKey("client", str)  # who sent the request (see SandboxServer._client)
_RUN_GRACE_S = 30.0  # on top of the run's own timeout, for the backend's own bookkeeping


def _error(status: int, kind: str, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message, "type": kind}, status=status, headers=headers)


@dataclass(slots=True)
class _Session:
    cm: AbstractAsyncContextManager[SandboxSession]
    session: SandboxSession
    last_used: float
    owner: str
    busy: int = 0


class SandboxServer:
    """Serves ``sandbox`` over HTTP (JSON). Endpoints:

    ``GET /health`` (no auth); ``POST /v1/run``; ``POST /v1/sessions``;
    ``POST /v1/sessions/{id}/run``; ``DELETE /v1/sessions/{id}``; ``POST /run_code``
    (SandboxFusion). With ``token`` set (one, or several: one per client) every other endpoint
    needs ``Authorization: Bearer <token>``; SandboxFusion clients, which send no header, can put
    it in the URL instead: ``http://host:port/auth/<token>/run_code``. Sessions live on this
    server only (ids carry a per-process prefix), belong to the client (token; without auth, the
    peer address) that opened them — another client gets 404 — and close after
    ``session_ttl_s`` idle. The backend's limits are ceilings: a request's own limits
    (``timeout_s``, ``memory_mb``, ``max_output_bytes``; SandboxFusion's ``run_timeout`` and
    ``memory_limit_MB``) may tighten them, a looser one is clamped to the server's; a lower
    memory limit runs on a sandbox built with it by ``factory`` (see :class:`MemoryTiers`;
    one-off runs only: a session keeps the server's). At most ``max_sessions`` are open,
    ``max_sessions_per_client`` per client, counted as each open arrives (before it waits for a
    run slot) and counting the session behind SandboxFusion's ``fetch_files``. Every error is
    JSON ``{"error", "type"}``; an unexpected exception is a 500 (``InternalError``), logged.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        max_concurrency: int = 8,
        max_queue: int | None = None,
        token: str | Sequence[str] | None = None,
        max_request_bytes: int = 16 << 20,
        session_ttl_s: float = 600.0,
        max_sessions: int = 256,
        max_sessions_per_client: int = 32,
        http: HttpLimits | None = None,
        factory: LimitsFactory | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.sandbox = sandbox
        self.tiers = MemoryTiers(sandbox, factory)
        self.gate = RunGate(
            max_concurrency, 4 * max_concurrency if max_queue is None else max_queue
        )
        tokens = [token] if isinstance(token, str) else list(token or ())
        self.tokens = tuple(t.encode() for t in tokens if t)
        self.max_request_bytes = max_request_bytes
        self.session_ttl_s = session_ttl_s
        self.max_sessions = max_sessions
        self.max_sessions_per_client = max_sessions_per_client
        self.instance = secrets.token_hex(4)
        self.sessions: dict[str, _Session] = {}
        self.caps = SessionCaps(max_sessions, max_sessions_per_client)
        self.draining = False
        self.port: int | None = None
        self._janitor: asyncio.Task[None] | None = None
        self.app = web.Application(
            client_max_size=max_request_bytes, middlewares=[self._middleware]
        )
        self.app.add_routes(
            [
                web.get("/health", self.health),
                web.post("/v1/run", self.run),
                web.post("/v1/sessions", self.open_session),
                web.post("/v1/sessions/{sid}/run", self.session_run),
                web.delete("/v1/sessions/{sid}", self.close_session),
                web.post("/run_code", self.run_code),
                web.post("/auth/{token}/run_code", self.run_code),
            ]
        )
        self._http = HttpServer(self.app, http, loggers=(__name__,))

    def _client(self, request: web.Request) -> str | None:
        """Who is asking: ``token<i>`` (the i-th token), the peer address without auth, or None
        for a wrong or missing token."""
        if not self.tokens or request.path == "/health":
            return f"peer:{request.remote}"
        given = request.match_info.get("token") or ""
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            given = header[len("Bearer ") :]
        found = None
        for i, token in enumerate(self.tokens):  # every token compared: no timing hint
            if hmac.compare_digest(given.encode(), token):
                found = f"token{i}"
        return found

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        client = self._client(request)
        if client is None:
            return _error(401, "Unauthorized", "missing or wrong token (Authorization: Bearer T)")
        request[_CLIENT] = client
        if self.draining and request.path != "/health":
            return _error(503, "Draining", "server is shutting down", **{"Retry-After": "1"})
        try:
            return await handler(request)
        except ConfigError as exc:
            return _error(400, "ConfigError", str(exc))
        except SandboxError as exc:
            return _error(500, "SandboxError", str(exc))
        except TimeoutError:
            return _error(500, "SandboxError", "the sandbox backend did not answer in time")
        except web.HTTPRequestEntityTooLarge:
            limit = self.max_request_bytes
            return _error(413, "TooLarge", f"request body is over {limit} bytes; send less data")
        except web.HTTPException:
            raise
        except Exception as exc:  # a bug, not the client's doing: JSON 500, logged once
            return internal_error(request, exc, log)

    async def _body(self, request: web.Request) -> Any:
        try:
            return await request.json()
        except ValueError:
            raise ConfigError("request body is not valid JSON") from None
        except RecursionError:  # json's C parser refuses deep nesting this way
            raise ConfigError("request body is JSON nested too deeply; flatten it") from None

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "draining" if self.draining else "ok",
                "backend": getattr(self.sandbox, "name", "?"),
                "active": self.gate.active,
                "queued": self.gate.waiting,
                "max_concurrency": self.gate.limit,
                "sessions": len(self.sessions),
                "max_sessions_per_client": self.max_sessions_per_client,
            }
        )

    def _timeout(self, req: RunRequest) -> float:
        """The run's wall clock: what it asked for, at most the server's limit (a ceiling)."""
        ceiling = self.sandbox.limits.timeout_s
        return ceiling if req.timeout_s is None else min(req.timeout_s, ceiling)

    async def _execute(self, target: Sandbox | SandboxSession, req: RunRequest) -> ExecResult:
        timeout = self._timeout(req)
        async with self.gate.slot(), asyncio.timeout(timeout + _RUN_GRACE_S):
            result = await target.run(
                req.code, language=req.language, timeout_s=timeout, stdin=req.stdin, files=req.files
            )
        cap = req.max_output_bytes
        tighter = cap is not None and cap < self.sandbox.limits.max_output_bytes
        return cap_output(result, cap if tighter else None)

    async def run(self, request: web.Request) -> web.Response:
        req = parse_run_request(await self._body(request))
        async with self.tiers.use(req.memory_mb) as sandbox:
            return web.json_response((await self._execute(sandbox, req)).to_dict())

    async def run_code(self, request: web.Request) -> web.Response:
        fusion = sandboxfusion_request(await self._body(request))
        async with self.tiers.use(fusion.run.memory_mb) as sandbox:
            try:
                if not fusion.fetch_files:
                    result = await self._execute(sandbox, fusion.run)
                    return web.json_response(sandboxfusion_response(result))
                with self._session_slot(request):
                    result, files = await self._run_and_fetch(sandbox, fusion)
                return web.json_response(sandboxfusion_response(result, files))
            except (ConfigError, SandboxError) as exc:
                return web.json_response(
                    {"status": "SandboxError", "message": str(exc), "run_result": None, "files": {}}
                )

    async def _run_and_fetch(
        self, sandbox: Sandbox, fusion: FusionRequest
    ) -> tuple[ExecResult, dict[str, str]]:
        """Run, then read ``fetch_files`` back: one session, so that they share a work dir."""
        async with sandbox.session() as session:
            result = await self._execute(session, fusion.run)
            fetch = RunRequest(fetch_code(fusion.fetch_files))
            return result, parse_fetched(await self._execute(session, fetch))

    def _session_slot(self, request: web.Request) -> contextlib.AbstractContextManager[None]:
        """One more session of the request's client while the block runs (see SessionCaps)."""
        owners = (e.owner for e in self.sessions.values())
        return self.caps.hold(request[_CLIENT], owners)

    async def open_session(self, request: web.Request) -> web.Response:
        client = request[_CLIENT]
        with self._session_slot(request):
            async with self.gate.slot():
                cm = self.sandbox.session()
                session = await cm.__aenter__()
            sid = f"{self.instance}-{secrets.token_hex(8)}"
            self.sessions[sid] = _Session(cm, session, time.monotonic(), client)
        return web.json_response({"session_id": sid})

    def _session(self, request: web.Request) -> _Session:
        sid = request.match_info["sid"]
        entry = self.sessions.get(sid)
        if entry is None or entry.owner != request[_CLIENT]:  # another's: as if it did not exist
            raise web.HTTPNotFound(
                text=(
                    f'{{"error": "session {sid} does not exist on this server (it expired, was '
                    'closed, or the server restarted); open a new session", "type": "NoSession"}'
                ),
                content_type="application/json",
            )
        return entry

    async def session_run(self, request: web.Request) -> web.Response:
        entry = self._session(request)
        req = parse_run_request(await self._body(request))
        if req.memory_mb is not None and req.memory_mb < self.sandbox.limits.memory_mb:
            raise ConfigError(
                f"memory_mb={req.memory_mb} is below this server's {self.sandbox.limits.memory_mb}"
                " MB, and a session keeps the memory limit it was opened with; send a lower "
                "memory_mb with one-off runs (/v1/run), or start the server with --memory-mb "
                f"{req.memory_mb}"
            )
        entry.busy += 1
        try:
            result = await self._execute(entry.session, req)
        finally:
            entry.busy -= 1
            entry.last_used = time.monotonic()
        return web.json_response(result.to_dict())

    async def close_session(self, request: web.Request) -> web.Response:
        entry = self._session(request)
        self.sessions.pop(request.match_info["sid"], None)
        await entry.cm.__aexit__(None, None, None)
        return web.json_response({"closed": True})

    async def _expire_sessions(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, min(self.session_ttl_s / 4, 30.0)))
            now = time.monotonic()
            for sid, entry in list(self.sessions.items()):
                if not entry.busy and now - entry.last_used > self.session_ttl_s:
                    self.sessions.pop(sid, None)
                    with contextlib.suppress(Exception):
                        await entry.cm.__aexit__(None, None, None)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on ``host:port`` (0: a free port); returns the port."""
        self.port = await self._http.start(host, port)
        self._janitor = asyncio.get_running_loop().create_task(self._expire_sessions())
        return int(self.port or 0)

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Refuse new work, let running requests finish (bounded), close sessions, stop."""
        self.draining = True
        deadline = time.monotonic() + drain_timeout_s
        while (self.gate.active or self.gate.waiting) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._janitor is not None:
            self._janitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._janitor
        sessions, self.sessions = list(self.sessions.values()), {}
        for entry in sessions:
            with contextlib.suppress(Exception):
                await entry.cm.__aexit__(None, None, None)
        await self.tiers.close()
        await self._http.stop()


def _factory(name: str, kwargs: dict[str, Any]) -> LimitsFactory:
    """Builds backend ``name`` as configured, but with the limits given."""
    from agentloop.sandboxes.base import make_sandbox

    def build(limits: SandboxLimits) -> Sandbox:
        return make_sandbox(name, **{**kwargs, "limits": limits})

    return build


async def serve(
    backend: str | Sandbox = "local",
    host: str = "127.0.0.1",
    port: int = 8080,
    max_concurrency: int = 8,
    token: str | Sequence[str] | None = None,
    *,
    backend_kwargs: Mapping[str, Any] | None = None,
    stop: asyncio.Event | None = None,
    **server_kwargs: Any,
) -> None:
    """Run a sandbox server until SIGTERM/SIGINT (or ``stop`` is set); drains gracefully."""
    import signal

    from agentloop.sandboxes.base import make_sandbox

    return_big_buffers()  # what 1 MB outputs leave in the heap goes back (measured: docs)
    factory: LimitsFactory | None = None
    if isinstance(backend, str):
        sandbox = make_sandbox(backend, **(backend_kwargs or {}))
        factory = _factory(backend, dict(backend_kwargs or {}))
    else:
        sandbox = backend
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    async with sandbox:
        server = SandboxServer(
            sandbox, max_concurrency=max_concurrency, token=token, factory=factory, **server_kwargs
        )
        if not server.tokens and not is_loopback(host):
            warn_open(host)
        bound = await server.start(host, port)
        print(f"agentloop sandbox server ({sandbox.name}) on http://{host}:{bound}", flush=True)
        try:
            await stop.wait()
        finally:
            await server.stop()


def run_from_args(args: Any) -> int:
    """Serve until SIGTERM/SIGINT with parsed ``serve-sandbox`` arguments; the exit status."""
    try:
        kwargs = backend_kwargs_from_args(args)
        asyncio.run(
            serve(
                args.backend,
                args.host,
                args.port,
                args.max_concurrency,
                read_tokens(args),
                backend_kwargs=kwargs,
                max_queue=args.max_queue,
                session_ttl_s=args.session_ttl_s,
                max_request_bytes=args.max_request_mb << 20,
                max_sessions=args.max_sessions,
                max_sessions_per_client=args.max_sessions_per_client,
                http=http_limits_from_args(args),
            )
        )
    except (ConfigError, SandboxError) as exc:
        print(f"serve-sandbox: {exc}")
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m agentloop.sandboxes.server`` (the same as ``agentloop serve-sandbox``)."""
    return run_from_args(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
