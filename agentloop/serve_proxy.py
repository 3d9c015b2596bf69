"""``agentloop serve-proxy``: the proxy as a standalone server in front of a model."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentloop.proxy.episode import EpisodeLimits, EpisodeSampling
from agentloop.sandboxes.http_limits import HttpLimits

__all__ = ["ServeProxyConfig", "serve_proxy"]


@dataclass(frozen=True)
class ServeProxyConfig:
    """What ``agentloop serve-proxy`` serves: ``model`` (a local directory) on an engine, as
    ``served_model`` (the name clients ask for), with per-episode ``limits``. Episodes start on
    an episode id's first request; ``GET /episodes/<id>`` returns what was recorded."""

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


async def serve_proxy(config: ServeProxyConfig, *, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set (or forever); prints the URL once it listens."""
    from transformers import AutoTokenizer

    from agentloop.chat import TokenBuilder
    from agentloop.eval import EvalConfig, open_engine
    from agentloop.proxy.server import AgentProxy
    from agentloop.rollout import RolloutConfig

    # A template that rewrites history is rendered per request, as at inference: a rewritten
    # history starts a new segment (the proxy's own "strip").
    builder = TokenBuilder(AutoTokenizer.from_pretrained(config.model), thinking="strip")
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
    async with (
        open_engine(engine_config) as engine,
        AgentProxy(
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
        ) as proxy,
    ):
        print(f"serving {config.model} as {config.served_model!r} on {proxy.url}", flush=True)
        await (stop or asyncio.Event()).wait()
