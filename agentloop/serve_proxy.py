"""``agentloop serve-proxy``: the proxy as a standalone server in front of a model."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentloop.proxy.episode import EpisodeLimits, EpisodeSampling
from agentloop.proxy.guard import ServerLimits
from agentloop.sandboxes.http_limits import HttpLimits
from agentloop.sandboxes.serve_args import is_loopback, warn_open

if TYPE_CHECKING:
    from agentloop.engines.base import Engine

__all__ = ["TOKEN_ENV", "ServeProxyConfig", "proxy_tokens", "serve_proxy"]

#: The environment variable holding the proxy's token (one, or several separated by commas).
TOKEN_ENV = "AGENTLOOP_PROXY_TOKEN"


@dataclass(frozen=True)
class ServeProxyConfig:
    """What ``agentloop serve-proxy`` serves: ``model`` (a local directory) on an engine, as
    ``served_model`` (the name clients ask for), with per-episode ``limits``. Episodes start on
    an episode id's first request (or ``POST /episodes``, which draws the id); ``GET
    /episodes/<id>`` returns what was recorded. ``tokens``: the clients' bearer tokens (none:
    the episode id is the only credential, and a non-loopback ``host`` gets a warning);
    ``server``: the body limit, episode lifetime and cap."""

    model: str
    served_model: str = "agentloop"
    engine: str = "auto"
    base_url: str | None = None
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8000
    limits: EpisodeLimits = field(default_factory=EpisodeLimits)
    parser: str = "auto"
    seed: int = 0
    http: HttpLimits = field(default_factory=HttpLimits)
    tokens: tuple[str, ...] = ()
    server: ServerLimits = field(default_factory=ServerLimits)


def proxy_tokens(token_file: str | None) -> tuple[str, ...]:
    """The proxy's tokens: from ``token_file`` (one per line) or ``$AGENTLOOP_PROXY_TOKEN``
    (comma-separated), as ``serve-sandbox`` reads its own."""
    from agentloop.sandboxes.serve_args import read_token_file

    if token_file is not None:
        return tuple(read_token_file(token_file))
    return tuple(t.strip() for t in os.environ.get(TOKEN_ENV, "").split(",") if t.strip())


async def serve_proxy(
    config: ServeProxyConfig, *, stop: asyncio.Event | None = None, engine: Engine | None = None
) -> None:
    """Serve until ``stop`` is set (or forever); prints the URL once it listens. ``engine``:
    serve this one instead of opening ``config``'s."""
    from transformers import AutoTokenizer

    from agentloop.chat import TokenBuilder
    from agentloop.model_files import check_model_dir
    from agentloop.sandboxes.http_server import check_port_free

    check_port_free(config.host, config.port)  # before the engine's minutes of loading
    check_model_dir(config.model, "--model", weights=config.engine != "openai")
    # A template that rewrites history is rendered per request, as at inference: a rewritten
    # history starts a new segment (the proxy's own "strip").
    builder = TokenBuilder(AutoTokenizer.from_pretrained(config.model), thinking="strip")
    if not config.tokens and not is_loopback(config.host):
        warn_open(
            config.host,
            server="proxy",
            risk="read, write and delete any episode whose id it knows or guesses, and use the "
            "model",
            env=TOKEN_ENV,
            logger="agentloop.proxy.server",
        )
    async with contextlib.AsyncExitStack() as stack:
        if engine is None:
            engine = await stack.enter_async_context(_open_engine(config))
        await _serve(config, builder, engine, stop or asyncio.Event())


def _open_engine(config: ServeProxyConfig) -> contextlib.AbstractAsyncContextManager[Engine]:
    from agentloop.eval import EvalConfig, open_engine
    from agentloop.rollout import RolloutConfig

    # open_engine reads the engine fields of an eval config; the env and out are not used
    engine_config = EvalConfig(
        env="agentloop/Agent-v0",
        model=config.model,
        out=Path("."),
        engine=config.engine,
        base_url=config.base_url,
        seed=config.seed,
        engine_args=config.engine_args,
        rollout=RolloutConfig(
            max_prompt_len=config.limits.max_prompt_len,
            max_response_len=config.limits.max_response_len,
        ),
    )
    return open_engine(engine_config)


async def _serve(
    config: ServeProxyConfig, builder: Any, engine: Engine, stop: asyncio.Event
) -> None:
    from agentloop.proxy.server import AgentProxy

    async with AgentProxy(
        engine,
        builder,
        model=config.served_model,
        open_episodes=True,
        limits=config.limits,
        sampling=EpisodeSampling(seed=None, fixed=False),
        parser=config.parser,
        host=config.host,
        port=config.port,
        http=config.http,
        tokens=config.tokens,
        server=config.server,
    ) as proxy:
        print(f"serving {config.model} as {config.served_model!r} on {proxy.url}", flush=True)
        await stop.wait()
