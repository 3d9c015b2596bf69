"""What every proxy route gets before its handler runs: auth, a body ceiling, JSON off the loop."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agentloop.errors import ConfigError
from agentloop.proxy.errors import ProxyRequestError, error_body
from agentloop.sandboxes.serve_args import find_token

__all__ = ["CLIENT", "ServerLimits", "guard_middleware", "read_json"]

log = logging.getLogger("agentloop.proxy.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Who sent the request: ``token<i>`` (the i-th token), or "" on a proxy without tokens.
CLIENT = web.RequestKey("agentloop_proxy_client", str)
_INLINE_BYTES = 256 << 10  # bodies up to this are parsed on the loop (well under 1 ms)


@dataclass(frozen=True)
class ServerLimits:
    """The proxy's per-client ceilings. ``max_body_bytes``: a request body over it is a 413
    (before it is parsed). ``episode_ttl_s`` / ``max_episodes``: client-opened episodes
    (``serve-proxy``) are dropped this long after their last request, and at most this many
    are open (:class:`~agentloop.proxy.store.EpisodeStore`). ``max_tool_sets``: distinct
    ``tools`` lists whose chat-template builders are kept (least recently used dropped)."""

    max_body_bytes: int = 8 << 20
    episode_ttl_s: float = 1800.0
    max_episodes: int = 1024
    max_tool_sets: int = 64

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_episodes", "max_tool_sets"):
            if getattr(self, name) < 1:
                raise ConfigError(f"proxy limit {name} must be >= 1, got {getattr(self, name)}")
        if not self.episode_ttl_s > 0:
            raise ConfigError(f"proxy episode_ttl_s must be > 0, got {self.episode_ttl_s}")


def _error(err: ProxyRequestError) -> web.Response:
    return web.json_response(error_body(err), status=err.status)


def _too_large(limit: int) -> web.Response:
    return _error(
        ProxyRequestError(
            f"the request body is over this proxy's limit of {limit} bytes (max_body_bytes; "
            "serve-proxy --max-body-mb): shorten the conversation or cut big tool outputs",
            status=413,
            param="body",
            code="request_too_large",
        )
    )


def guard_middleware(
    tokens: Sequence[bytes],
    max_body_bytes: int,
    on_too_large: Callable[[web.Request], None] = lambda request: None,
) -> Any:
    """The app's middleware: with ``tokens``, every request needs ``Authorization: Bearer
    <token>`` (compared in constant time; the episode id then goes in the path); a body over
    ``max_body_bytes`` is a 413 before it is read; a :class:`ProxyRequestError` anywhere is its
    OpenAI-shaped answer and an unexpected exception a logged JSON 500, never a traceback.
    ``on_too_large(request)`` is told of each 413 (the proxy records it on the episode)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        client = ""
        if tokens:
            header = request.headers.get("Authorization", "")
            given = header[len("Bearer ") :] if header.startswith("Bearer ") else ""
            found = find_token(given, tokens)
            if found is None:
                return _error(
                    ProxyRequestError(
                        "missing or wrong token: send this proxy's token as the API key "
                        "(Authorization: Bearer <token>) and the episode in the base URL "
                        "(/episodes/<episode id>/v1)",
                        status=401,
                        kind="authentication_error",
                        code="invalid_api_key",
                    )
                )
            client = f"token{found}"
        request[CLIENT] = client
        try:
            if (request.content_length or 0) > max_body_bytes:
                raise web.HTTPRequestEntityTooLarge(max_body_bytes, request.content_length or 0)
            return await handler(request)
        except ProxyRequestError as exc:
            return _error(exc)
        except web.HTTPRequestEntityTooLarge:  # unread (Content-Length) or grown past it
            on_too_large(request)
            return _too_large(max_body_bytes)  # aiohttp reads and drops the rest of the body
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _error(ProxyRequestError(f"{exc.status}: {exc.reason}", status=exc.status))
        except Exception as exc:  # a bug, not the client's doing: JSON 500, logged once
            log.exception("proxy request %s %s failed", request.method, request.path)
            return _error(
                ProxyRequestError(
                    f"internal error: {type(exc).__name__} (logged by the proxy)",
                    status=500,
                    kind="server_error",
                )
            )

    return middleware


async def read_json(request: web.Request) -> Any:
    """The request body as JSON; a big body is parsed on a worker thread. Reading stops at
    the app's ``client_max_size`` (a 413)."""
    raw = await request.read()
    try:
        if len(raw) <= _INLINE_BYTES:
            return json.loads(raw)
        return await asyncio.to_thread(json.loads, raw)
    except ValueError as exc:
        raise ProxyRequestError(
            f"the request body is not JSON: {str(exc)[:200]}", param="body"
        ) from None
    except RecursionError:  # json's C parser refuses deep nesting this way
        raise ProxyRequestError(
            "the request body is JSON nested too deeply", param="body"
        ) from None
