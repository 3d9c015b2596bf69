"""Play one agent program's episode: run it against an in-process proxy, return its segments."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from agentloop.chat import TokenBuilder
from agentloop.engines.base import Engine
from agentloop.envs.base import AgentProgram
from agentloop.proxy.episode import EpisodeLimits, EpisodeSampling
from agentloop.proxy.server import AgentProxy
from agentloop.rollout import RolloutConfig
from agentloop.types import StopReason, Task, Trajectory

__all__ = ["agent_rollout", "shared_proxy"]


@dataclass
class _Shared:
    proxy: AgentProxy
    users: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


_SHARED: dict[tuple[int, int, str], _Shared] = {}


@contextlib.asynccontextmanager
async def shared_proxy(
    engine: Engine, builder: TokenBuilder, model: str
) -> AsyncIterator[AgentProxy]:
    """One loopback proxy per (event loop, engine, model name) while episodes use it: the
    first episode starts it, the last one to finish stops it."""
    key = (id(asyncio.get_running_loop()), id(engine), model)
    entry = _SHARED.get(key)
    if entry is None:
        entry = _SHARED[key] = _Shared(AgentProxy(engine, builder, model=model))
    entry.users += 1
    try:
        async with entry.lock:
            if not entry.proxy.started:
                await entry.proxy.start()
        yield entry.proxy
    finally:
        entry.users -= 1
        if entry.users == 0:
            if _SHARED.get(key) is entry:
                del _SHARED[key]
            await entry.proxy.stop()


def _limits(program: AgentProgram, config: RolloutConfig) -> EpisodeLimits:
    return EpisodeLimits(
        max_turns=min(config.max_turns, program.max_turns or config.max_turns),
        max_prompt_len=config.max_prompt_len,
        max_response_len=min(
            config.max_response_len, program.max_tokens or config.max_response_len
        ),
        max_turn_tokens=config.max_turn_tokens,
    )


async def agent_rollout(
    program: AgentProgram,
    engine: Engine,
    builder: TokenBuilder,
    task: Task,
    config: RolloutConfig,
    *,
    sample_index: int = 0,
    seed: int | None = None,
) -> list[Trajectory]:
    """Run ``program.agent`` on ``task`` and return the episode's trajectories, one per segment
    (one unless the agent rewrote its history). Like :func:`agentloop.rollout.rollout` it never
    raises for the episode's failures: an agent exception, a limit or the deadline end the
    episode with a stop reason; sampling follows ``config`` whatever the agent asks."""
    timeout = min(config.timeout_s, program.timeout_s or config.timeout_s)
    sampling = EpisodeSampling(config.temperature, config.top_p, config.top_k, seed, fixed=True)
    reason, error, answer = StopReason.DONE, None, None
    async with shared_proxy(engine, builder, program.model) as proxy:
        episode = proxy.open_episode(
            f"{task.id}#{sample_index}-{secrets.token_hex(16)}",
            builder=builder,
            limits=_limits(program, config),
            sampling=sampling,
            parser=config.parser,
        )
        client = proxy.client(episode, timeout=timeout)
        try:
            async with asyncio.timeout(timeout):
                answer = await program.agent(task, client)
        except TimeoutError:
            reason, error = StopReason.TIMEOUT, f"the agent ran past timeout_s={timeout}"
        except Exception as exc:  # the agent's failure is this episode's data
            reason, error = StopReason.ENV_ERROR, f"the agent raised {type(exc).__name__}: {exc}"
        finally:  # the client's connection pool is the proxy's: nothing to close
            proxy.close_episode(episode.id)
            await program.close()
    if episode.limit_hit is not None and reason is not StopReason.TIMEOUT:
        reason = episode.limit_hit  # the agent hit a ceiling (and perhaps raised on it)
    reward = 0.0
    if not reason.is_error:
        try:
            reward = program.score(task, answer if isinstance(answer, str) else None)
        except Exception as exc:
            reason, error = StopReason.ENV_ERROR, f"reward raised {type(exc).__name__}: {exc}"
    return episode.trajectories(
        task.id, reward=reward, stop_reason=reason, error=error, sample_index=sample_index
    )
