"""AgentProxy: an OpenAI-compatible aiohttp server in front of an agentloop engine.

Agents talk to it with any OpenAI client (``/v1/chat/completions`` with tools and streaming,
``/v1/responses`` (the Responses API, :mod:`agentloop.proxy.responses`), ``/v1/completions``,
``/v1/models``). A streamed answer is sent once the whole completion is
generated (the engine protocol is token-in/token-out), in OpenAI's chunk format: clients that
stream work unchanged, but see the first chunk only at the end of generation. The episode a
request belongs to is the client's API key (``Authorization: Bearer <episode id>``) or a base-URL
path ``/episodes/<episode id>/v1``, so an unmodified ``openai.AsyncOpenAI(base_url=...,
api_key=episode_id)`` works. Every request is rendered with the chat template, generated
token-in/token-out, and recorded per episode (:class:`~agentloop.proxy.episode.Episode`).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
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
from agentloop.proxy.openai_api import (
    ProxyRequestError,
    chat_response,
    chat_stream_chunks,
    completion_response,
    completion_stream_chunks,
    error_body,
    parse_chat_request,
    parse_completion_request,
)
from agentloop.sandboxes.http_limits import HttpLimits
from agentloop.sandboxes.http_server import HttpServer
from agentloop.types import StopReason

if TYPE_CHECKING:
    import openai

__all__ = ["AgentProxy"]

log = logging.getLogger(__name__)
_MAX_BODY = 64 * 1024 * 1024


class AgentProxy:
    """Serve ``engine`` to agents and record their episodes token-exactly.

    ``builder`` gives the tokenizer and chat template (each request's ``tools`` get a builder of
    their own). ``model`` is the one model name clients may ask for. With ``open_episodes``
    (``agentloop serve-proxy``) an unknown episode id starts an episode with ``limits`` and
    ``sampling``; otherwise episodes are opened by :meth:`open_episode` (training, eval) and a
    request naming another id is refused.

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
    ) -> None:
        self.engine, self.builder, self.model = engine, builder, model
        self.http_limits = http  # header/body timeouts, connection cap: the servers' transport
        self.open_episodes = open_episodes
        self.limits = limits or EpisodeLimits()
        self.sampling = sampling or EpisodeSampling(fixed=False)
        self.parser = parser
        self.host, self.port = host, port
        self.episodes: dict[str, Episode] = {}
        self.requests_served = 0
        self.requests_failed = 0
        self._builders: dict[tuple[int, str], tuple[TokenBuilder, TokenBuilder]] = {}
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
        app = web.Application(client_max_size=_MAX_BODY)
        for prefix in ("", "/episodes/{eid}"):
            app.router.add_get(f"{prefix}/v1/models", self._models)
            app.router.add_post(f"{prefix}/v1/chat/completions", self._chat)
            app.router.add_post(f"{prefix}/v1/completions", self._completions)
            app.router.add_post(f"{prefix}/v1/responses", self._responses)
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
        is the one the chat template implies."""
        eid = episode_id or f"ep-{uuid.uuid4().hex}"
        if eid in self.episodes:
            raise AgentLoopError(f"episode {eid!r} is already open; close it first")
        base = builder or self.builder
        episode = Episode(
            eid,
            lambda tools: self._builder(base, tools),
            limits or self.limits,
            sampling or self.sampling,
            parser=base.parser_for(parser or self.parser),
        )
        self.episodes[eid] = episode
        return episode

    def close_episode(self, episode_id: str) -> Episode:
        """Stop recording ``episode_id`` and return it (later requests for it are refused)."""
        return self.episodes.pop(episode_id)

    def client(self, episode: Episode, *, timeout: float = 600.0) -> openai.AsyncOpenAI:
        """A real ``openai.AsyncOpenAI`` whose requests belong to ``episode``. No retries: a
        retried request would be a second sample. The clients of all episodes share one
        connection pool (closed with the proxy), so one need not be closed, and making one
        costs no TLS set-up (~0.1 s per client otherwise)."""
        import openai

        if self._http is None:
            self._http = openai.DefaultAsyncHttpxClient()
        return openai.AsyncOpenAI(
            base_url=self.url,
            api_key=episode.id,
            max_retries=0,
            timeout=timeout,
            http_client=self._http,
        )

    def _builder(self, base: TokenBuilder, tools: Sequence[Mapping[str, Any]]) -> TokenBuilder:
        if not tools:
            return base
        key = (id(base), json.dumps(list(tools), sort_keys=True))
        hit = self._builders.get(key)
        if hit is None:
            try:
                built = TokenBuilder(
                    base.tokenizer,
                    tools=tools,
                    chat_template=base.chat_template,
                    thinking=base.thinking,
                )
            except AgentLoopError as exc:
                raise ProxyRequestError(
                    f"the chat template cannot render tools: {exc}", param="tools"
                ) from exc
            hit = self._builders[key] = (base, built)  # keeps base alive: its id stays unique
        return hit[1]

    def _episode(self, request: web.Request) -> Episode:
        eid = request.match_info.get("eid")
        if eid is None:
            auth = request.headers.get("Authorization", "")
            eid = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        if not eid:
            raise ProxyRequestError(
                "no episode id: send it as the API key (Authorization: Bearer <episode id>) "
                "or in the base URL (/episodes/<episode id>/v1)",
                status=401,
                kind="authentication_error",
            )
        episode = self.episodes.get(eid)
        if episode is None:
            if not self.open_episodes:
                raise ProxyRequestError(
                    f"unknown episode id {eid[:40]!r}: it was never opened or has ended",
                    status=401,
                    kind="authentication_error",
                    code="invalid_api_key",
                )
            episode = self.open_episode(eid)
        return episode

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
            req = parse_chat_request(await _json(request))
            self._check_model(req.model)
            episode = self._episode(request)
            async with episode.lock:
                p = episode.prepare_chat(
                    req.messages, req.tools, req.max_tokens, req.temperature, req.top_p
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
                return await _sse(request, chunks)
            body = chat_response(
                rid, self.model, reply.content, reply.calls, reply.completion.finish_reason, usage
            )
            return web.json_response(body)

        return await self._answer(serve)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        async def serve() -> web.StreamResponse:
            req = parse_completion_request(await _json(request))
            self._check_model(req.model)
            episode = self._episode(request)
            async with episode.lock:
                p = episode.prepare_text(req.prompt, req.max_tokens, req.temperature, req.top_p)
                reply = await self._generate(episode, p)
            rid, usage = f"cmpl-{uuid.uuid4().hex}", _usage(p, reply)
            finish = reply.completion.finish_reason
            if req.stream:
                chunks = completion_stream_chunks(
                    rid, self.model, reply.text, finish, usage if req.include_usage else None
                )
                return await _sse(request, chunks)
            return web.json_response(
                completion_response(rid, self.model, reply.text, finish, usage)
            )

        return await self._answer(serve)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        async def serve() -> web.StreamResponse:
            req = responses.parse_responses_request(await _json(request))
            self._check_model(req.model)
            episode = self._episode(request)
            async with episode.lock:
                items = responses.conversation(req, episode.responses)
                messages = responses.with_instructions(req, items)
                p = episode.prepare_chat(
                    messages, req.tools, req.max_tokens, req.temperature, req.top_p
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

    async def _get_episode(self, request: web.Request) -> web.Response:
        return self._episode_json(request, self.episodes.get(request.match_info["eid"]))

    async def _delete_episode(self, request: web.Request) -> web.Response:
        return self._episode_json(request, self.episodes.pop(request.match_info["eid"], None))

    def _episode_json(self, request: web.Request, episode: Episode | None) -> web.Response:
        if episode is None:
            err = ProxyRequestError(f"no episode {request.match_info['eid']!r}", status=404)
            return web.json_response(error_body(err), status=404)
        trajectories = episode.trajectories(episode.id, reward=0.0, stop_reason=StopReason.DONE)
        return web.json_response(
            {
                "episode": episode.id,
                "requests": episode.requests,
                "segments": [trajectory_to_dict(t) for t in trajectories],
            }
        )


async def _json(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError as exc:
        raise ProxyRequestError(f"the request body is not JSON: {exc}", param="body") from exc
    except RecursionError:  # json's C parser refuses deep nesting this way
        raise ProxyRequestError(
            "the request body is JSON nested too deeply", param="body"
        ) from None


def _usage(p: Prepared, reply: Reply) -> tuple[int, int]:
    return len(p.prompt_ids), len(reply.completion.token_ids)


async def _sse(request: web.Request, chunks: Sequence[dict[str, Any]]) -> web.StreamResponse:
    """Server-sent events: one ``data:`` line per chunk, then ``data: [DONE]``. The chunks are
    of a finished completion (the tool calls are parsed from the whole text), not
    token-by-token increments."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for chunk in chunks:
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
