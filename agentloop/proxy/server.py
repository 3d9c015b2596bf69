"""AgentProxy: an OpenAI-compatible aiohttp server in front of an agentloop engine.

Agents talk to it with any OpenAI client (``/v1/chat/completions`` with tools and streaming,
``/v1/responses`` (the Responses API, :mod:`agentloop.proxy.responses`), ``/v1/completions``,
``/v1/models``). A streamed answer is sent once the whole completion is
generated (the engine protocol is token-in/token-out), in OpenAI's chunk format: clients that
stream work unchanged, but see the first chunk only at the end of generation. The episode a
request belongs to is the client's API key (``Authorization: Bearer <episode id>``) or a base-URL
path ``/episodes/<episode id>/v1``, so an unmodified ``openai.AsyncOpenAI(base_url=...,
api_key=episode_id)`` works; with ``tokens`` the API key is a token and the episode is in the
path. Every request is rendered with the chat template, generated token-in/token-out, and
recorded per episode (:class:`~agentloop.proxy.episode.Episode`); rendering and tokenizing run
on worker threads, after a size check that refuses what cannot fit without tokenizing it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agentloop.chat import TokenBuilder
from agentloop.engines.base import Engine, generate
from agentloop.errors import AgentLoopError
from agentloop.io import trajectory_to_dict
from agentloop.proxy import responses
from agentloop.proxy.episode import Episode, EpisodeLimits, EpisodeSampling, Prepared, Reply
from agentloop.proxy.errors import ProxyRequestError, error_body
from agentloop.proxy.guard import CLIENT, ServerLimits, guard_middleware, read_json
from agentloop.proxy.openai_api import (
    chat_response,
    chat_stream_chunks,
    completion_response,
    completion_stream_chunks,
    parse_chat_request,
    parse_completion_request,
    sse_response,
)
from agentloop.proxy.records import TextBounds
from agentloop.proxy.store import EpisodeStore
from agentloop.sandboxes.http_limits import HttpLimits
from agentloop.sandboxes.http_server import HttpServer
from agentloop.types import StopReason

if TYPE_CHECKING:
    import openai

__all__ = ["AgentProxy"]

log = logging.getLogger(__name__)
_MAX_ID = 200  # characters of a client-chosen episode id


class AgentProxy:
    """Serve ``engine`` to agents and record their episodes token-exactly.

    ``builder`` gives the tokenizer and chat template (each request's ``tools`` get a builder of
    their own). ``model`` is the one model name clients may ask for. With ``open_episodes``
    (``agentloop serve-proxy``) an unknown episode id starts an episode with ``limits`` and
    ``sampling``; otherwise episodes are opened by :meth:`open_episode` (training, eval) and a
    request naming another id is refused. ``POST /episodes`` opens one with an id the proxy
    draws (192 random bits): the id is the credential to the episode, as an API key is.

    ``tokens`` (one, or one per client): every request needs ``Authorization: Bearer <token>``
    and names its episode in the path (``/episodes/<id>/v1``); a client sees only the episodes
    its token opened. ``server`` holds the per-client ceilings (body size, episode lifetime and
    cap, cached tool sets).

    Use ``async with AgentProxy(...) as proxy`` (or :meth:`start` / :meth:`stop`).
    """

    def __init__(
        self,
        engine: Engine,
        builder: TokenBuilder,
        *,
        model: str = "agentloop",
        open_episodes: bool = False,
        limits: EpisodeLimits | None = None,
        sampling: EpisodeSampling | None = None,
        parser: str = "auto",
        host: str = "127.0.0.1",
        port: int = 0,
        http: HttpLimits | None = None,
        tokens: Sequence[str] = (),
        server: ServerLimits | None = None,
    ) -> None:
        self.engine, self.builder, self.model = engine, builder, model
        self.http_limits = http  # header/body timeouts, connection cap: the servers' transport
        self.open_episodes = open_episodes
        self.limits = limits or EpisodeLimits()
        self.sampling = sampling or EpisodeSampling(fixed=False)
        self.parser = parser
        self.host, self.port = host, port
        self.server_limits = server or ServerLimits()
        self.tokens = tuple(t.encode() for t in tokens if t)
        self.episodes = EpisodeStore(
            self.server_limits.episode_ttl_s, self.server_limits.max_episodes
        )
        self.requests_served = 0
        self.requests_failed = 0
        # (id(base), digest of the tools) -> (base kept alive, builder); least recently used first
        self._builders: OrderedDict[tuple[int, str], tuple[TokenBuilder, TokenBuilder]] = (
            OrderedDict()
        )
        self._builders_lock = threading.Lock()  # episodes prepare requests on worker threads
        self._bounds: dict[int, tuple[TokenBuilder, TextBounds]] = {}
        self._server: HttpServer | None = None
        self._http: Any = None  # the clients' shared httpx pool, made on first use

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """Whether it listens (between :meth:`start` and :meth:`stop`)."""
        return self._server is not None

    @property
    def url(self) -> str:
        """The API root to give clients as ``base_url`` (``http://host:port/v1``)."""
        if self._server is None:
            raise AgentLoopError("the proxy is not started; use `async with AgentProxy(...)`")
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> None:
        await asyncio.to_thread(self._text_bounds, self.builder)  # a vocabulary scan, once
        if not self.open_episodes and self._http is None:  # clients come from client()
            self._http = await asyncio.to_thread(_http_pool)  # (importing openai: off the loop)
        limit = self.server_limits.max_body_bytes
        guard = guard_middleware(self.tokens, limit, self._too_large)
        app = web.Application(client_max_size=limit, middlewares=[guard])
        for prefix in ("", "/episodes/{eid}"):
            app.router.add_get(f"{prefix}/v1/models", self._models)
            app.router.add_post(f"{prefix}/v1/chat/completions", self._chat)
            app.router.add_post(f"{prefix}/v1/completions", self._completions)
            app.router.add_post(f"{prefix}/v1/responses", self._responses)
        app.router.add_post("/episodes", self._new_episode)
        app.router.add_get("/episodes/{eid}", self._get_episode)
        app.router.add_delete("/episodes/{eid}", self._delete_episode)
        self._server = HttpServer(app, self.http_limits, loggers=(__name__,))
        self.port = await self._server.start(self.host, self.port)  # 0: the free port bound

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self._server is not None:
            await self._server.stop()
            self._server = None

    async def __aenter__(self) -> AgentProxy:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- episodes ----------------------------------------------------------------------------
    def open_episode(
        self,
        episode_id: str | None = None,
        *,
        builder: TokenBuilder | None = None,
        limits: EpisodeLimits | None = None,
        sampling: EpisodeSampling | None = None,
        parser: str | None = None,
    ) -> Episode:
        """Start recording an episode; its id is what the agent's client sends as API key.
        ``parser`` (default: the proxy's) reads tool calls out of the model's text; ``auto``
        is the one the chat template implies. Without ``episode_id`` the proxy draws an
        unguessable one."""
        return self._open(episode_id, builder, limits, sampling, parser, None, managed=False)

    def _open(
        self,
        episode_id: str | None,
        builder: TokenBuilder | None,
        limits: EpisodeLimits | None,
        sampling: EpisodeSampling | None,
        parser: str | None,
        client: str | None,
        *,
        managed: bool,
    ) -> Episode:
        eid = episode_id or f"ep-{secrets.token_urlsafe(24)}"
        base = builder or self.builder
        episode = Episode(
            eid,
            lambda tools: self._builder(base, tools),
            limits or self.limits,
            sampling or self.sampling,
            parser=base.parser_for(parser or self.parser),
            bounds=self._text_bounds(base),
        )
        self.episodes.add(episode, client, managed=managed)
        return episode

    def close_episode(self, episode_id: str) -> Episode:
        """Stop recording ``episode_id`` and return it (later requests for it are refused)."""
        episode = self.episodes.pop(episode_id)
        if episode is None:
            raise KeyError(episode_id)
        return episode

    def client(self, episode: Episode, *, timeout: float = 600.0) -> openai.AsyncOpenAI:
        """A real ``openai.AsyncOpenAI`` whose requests belong to ``episode``. No retries: a
        retried request would be a second sample. The clients of all episodes share one
        connection pool (closed with the proxy), so one need not be closed, and making one
        costs no TLS set-up (~0.1 s per client otherwise)."""
        import openai

        if self._http is None:
            self._http = _http_pool()
        return openai.AsyncOpenAI(
            base_url=self.url,
            api_key=episode.id,
            max_retries=0,
            timeout=timeout,
            http_client=self._http,
        )

    def _text_bounds(self, base: TokenBuilder) -> TextBounds:
        hit = self._bounds.get(id(base))
        if hit is None:  # keeps base alive: its id stays unique
            hit = self._bounds[id(base)] = (base, TextBounds.of(base))
        return hit[1]

    def _builder(self, base: TokenBuilder, tools: Sequence[Mapping[str, Any]]) -> TokenBuilder:
        """The builder for ``tools`` (called on worker threads); a bounded LRU cache, and no
        entry for a tool list too big to fit any context (its request is refused anyway)."""
        if not tools:
            return base
        text = json.dumps(list(tools), sort_keys=True)
        key = (id(base), hashlib.sha256(text.encode()).hexdigest())
        with self._builders_lock:
            hit = self._builders.get(key)
            if hit is not None:
                self._builders.move_to_end(key)
                return hit[1]
        try:
            built = TokenBuilder(
                base.tokenizer,
                tools=tools,
                chat_template=base.chat_template,
                thinking=base.thinking,
            )
        except (AgentLoopError, RecursionError) as exc:
            raise ProxyRequestError(
                f"the chat template cannot render tools: {exc}", param="tools"
            ) from exc
        fits = len(text) <= self.limits.max_context * self._text_bounds(base).max_token_chars
        with self._builders_lock:
            if fits:
                self._builders[key] = (base, built)  # keeps base alive: its id stays unique
                while len(self._builders) > self.server_limits.max_tool_sets:
                    self._builders.popitem(last=False)
        return built

    def _episode(self, request: web.Request) -> Episode:
        """The request's episode: from the path, else (without tokens) the API key."""
        eid = request.match_info.get("eid")
        if eid is None and not self.tokens:
            auth = request.headers.get("Authorization", "")
            eid = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        if not eid:
            where = "the base URL (/episodes/<episode id>/v1)"
            raise ProxyRequestError(
                f"no episode id: send it in {where}"
                if self.tokens
                else f"no episode id: send it as the API key (Authorization: Bearer <episode "
                f"id>) or in {where}",
                status=401,
                kind="authentication_error",
            )
        client = _client(request)
        episode = self.episodes.lookup(eid, client)
        if episode is None:
            if not self.open_episodes or eid in self.episodes:  # another client's: not yours
                raise ProxyRequestError(
                    f"unknown episode id {eid[:40]!r}: it was never opened, has ended or "
                    "expired, or belongs to another client",
                    status=401,
                    kind="authentication_error",
                    code="invalid_api_key",
                )
            if len(eid) > _MAX_ID:
                raise ProxyRequestError(
                    f"an episode id has at most {_MAX_ID} characters, got {len(eid)}",
                    status=401,
                    kind="authentication_error",
                    code="invalid_api_key",
                )
            episode = self._open(eid, None, None, None, None, client, managed=True)
        return episode

    def _too_large(self, request: web.Request) -> None:
        """A 413: the request's episode (if it names one) records a context overflow."""
        self.requests_failed += 1
        eid = request.match_info.get("eid")
        if eid is None and not self.tokens:
            eid = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        episode = self.episodes.lookup(eid or "", _client(request))
        if episode is not None:
            episode.limit_hit = StopReason.CONTEXT_OVERFLOW

    def _check_model(self, model: str) -> None:
        if model != self.model:
            raise ProxyRequestError(
                f"model {model!r} does not exist here; this proxy serves {self.model!r}",
                status=404,
                param="model",
                code="model_not_found",
            )

    # -- handlers ----------------------------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": self.model, "object": "model", "created": 0, "owned_by": "agentloop"}
        return web.json_response({"object": "list", "data": [model]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        async def serve() -> web.StreamResponse:
            req = parse_chat_request(await read_json(request))
            self._check_model(req.model)
            episode = self._episode(request)
            async with episode.lock:
                p = await asyncio.to_thread(
                    episode.prepare_chat,
                    req.messages,
                    req.tools,
                    req.max_tokens,
                    req.temperature,
                    req.top_p,
                )
                reply = await self._generate(episode, p)
            rid, usage = f"chatcmpl-{uuid.uuid4().hex}", _usage(p, reply)
            if req.stream:
                chunks = chat_stream_chunks(
                    rid,
                    self.model,
                    reply.content,
                    reply.calls,
                    reply.completion.finish_reason,
                    usage if req.include_usage else None,
                )
                return await sse_response(request, chunks)
            body = chat_response(
                rid, self.model, reply.content, reply.calls, reply.completion.finish_reason, usage
            )
            return web.json_response(body)

        return await self._answer(serve)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        async def serve() -> web.StreamResponse:
            req = parse_completion_request(await read_json(request))
            self._check_model(req.model)
            episode = self._episode(request)
            async with episode.lock:
                p = await asyncio.to_thread(
                    episode.prepare_text, req.prompt, req.max_tokens, req.temperature, req.top_p
                )
                reply = await self._generate(episode, p)
            rid, usage = f"cmpl-{uuid.uuid4().hex}", _usage(p, reply)
            finish = reply.completion.finish_reason
            if req.stream:
                chunks = completion_stream_chunks(
                    rid, self.model, reply.text, finish, usage if req.include_usage else None
                )
                return await sse_response(request, chunks)
            return web.json_response(
                completion_response(rid, self.model, reply.text, finish, usage)
            )

        return await self._answer(serve)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        async def serve() -> web.StreamResponse:
            req = responses.parse_responses_request(await read_json(request))
            self._check_model(req.model)
            episode = self._episode(request)
            async with episode.lock:
                items = responses.conversation(req, episode.responses)
                messages = responses.with_instructions(req, items)
                p = await asyncio.to_thread(
                    episode.prepare_chat,
                    messages,
                    req.tools,
                    req.max_tokens,
                    req.temperature,
                    req.top_p,
                )
                reply = await self._generate(episode, p)
                rid = responses.new_response_id()
                answer = (reply.content, reply.calls, reply.completion.finish_reason)
                body = responses.response_object(rid, req, answer, _usage(p, reply))
                episode.responses[rid] = items + responses.output_items(body)
            if req.stream:
                return await responses.write_events(request, responses.response_events(body))
            return web.json_response(body)

        return await self._answer(serve)

    async def _answer(self, serve: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await serve()
        except ProxyRequestError as exc:
            self.requests_failed += 1
            return web.json_response(error_body(exc), status=exc.status)
        self.requests_served += 1
        return response

    async def _generate(self, episode: Episode, p: Prepared) -> Reply:
        t0 = time.perf_counter()
        try:
            completion = await generate(
                self.engine, p.prompt_ids, p.sampling, session_id=episode.id
            )
        except Exception as exc:  # the agent gets a 500 naming it; the episode records it
            episode.limit_hit = StopReason.ENGINE_ERROR
            log.warning("engine failed for episode %s: %s", episode.id, exc)
            raise ProxyRequestError(
                f"the engine failed: {type(exc).__name__}: {exc}",
                status=500,
                kind="server_error",
                code="engine_error",
            ) from exc
        return episode.commit(p, completion, t0)

    async def _new_episode(self, request: web.Request) -> web.Response:
        """``POST /episodes``: open an episode under an id the proxy draws (the credential)."""
        if not self.open_episodes:
            raise ProxyRequestError(
                "this proxy opens its episodes itself (training, eval); it takes no new ones",
                status=403,
                kind="permission_error",
            )
        episode = self._open(None, None, None, None, None, _client(request), managed=True)
        root = f"{request.scheme}://{request.host}"
        return web.json_response(
            {"episode": episode.id, "base_url": f"{root}/episodes/{episode.id}/v1"}, status=201
        )

    async def _get_episode(self, request: web.Request) -> web.Response:
        eid = request.match_info["eid"]
        return self._episode_json(eid, self.episodes.lookup(eid, _client(request)))

    async def _delete_episode(self, request: web.Request) -> web.Response:
        eid = request.match_info["eid"]
        return self._episode_json(eid, self.episodes.pop(eid, _client(request)))

    def _episode_json(self, eid: str, episode: Episode | None) -> web.Response:
        if episode is None:
            err = ProxyRequestError(f"no episode {eid[:40]!r}", status=404)
            return web.json_response(error_body(err), status=404)
        trajectories = episode.trajectories(episode.id, reward=0.0, stop_reason=StopReason.DONE)
        return web.json_response(
            {
                "episode": episode.id,
                "requests": episode.requests,
                "segments": [trajectory_to_dict(t) for t in trajectories],
            }
        )


def _http_pool() -> Any:
    """The connection pool the clients of :meth:`AgentProxy.client` share. It only ever talks
    plain HTTP to this proxy, so it loads no CA bundle (``verify=False``: no TLS at all; the
    bundle would hold the interpreter ~0.1-0.3 s, stalling every episode, once per proxy)."""
    import openai

    return openai.DefaultAsyncHttpxClient(verify=False)


def _client(request: web.Request) -> str | None:
    return request[CLIENT] or None


def _usage(p: Prepared, reply: Reply) -> tuple[int, int]:
    return len(p.prompt_ids), len(reply.completion.token_ids)
