"""collect: run many episodes concurrently and group them per task; failures are kept as data."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

from agentloop.chat import TokenBuilder
from agentloop.engines.base import Engine
from agentloop.envs import Env, make
from agentloop.errors import ConfigError
from agentloop.rollout import RolloutConfig, check_builder, rollout_episode
from agentloop.types import StopReason, Task, Trajectory, TrajectoryGroup

__all__ = [
    "collect",
    "gather_groups",
    "make_builder",
    "play_one",
    "resolve_env",
    "rollout_gc",
    "stable_seed",
]

EnvFactory = Callable[[], Env]
_YOUNG_GC_EVERY = 10_000
YOUNG_GC_PER_EPISODE = 200  # allocations per running episode between young collections


def make_builder(
    tokenizer: Any, env_id: str, *, thinking: str = "auto", **env_kwargs: Any
) -> TokenBuilder:
    """A TokenBuilder whose system turn shows the tools of env ``env_id``, with the
    thinking-history policy ``thinking`` (``rollout.thinking``)."""
    return TokenBuilder(tokenizer, tools=make(env_id, **env_kwargs).tool_schemas, thinking=thinking)


def _check_tools(builder: TokenBuilder, schemas: Sequence[Mapping[str, Any]], env_id: str) -> None:
    """The tools the builder's system turn shows are the env's: a builder reused from another
    env would prompt the model with tools the env cannot run, and hide the ones it can."""
    shown = [t.get("function", t).get("name") for t in builder.tools or []]
    has = [t.get("function", t).get("name") for t in schemas]
    if sorted(shown) != sorted(has):
        raise ConfigError(
            f"the TokenBuilder shows the model the tools {shown}, but env {env_id!r} has "
            f"{has}; build one for this env: make_builder(tokenizer, {env_id!r})"
        )


def stable_seed(*parts: object) -> int:
    """A 31-bit seed hashed from ``parts``, e.g. (run seed, task id, sample index): different
    parts give unrelated seeds, the same parts give the same seed in every process and rerun
    (unlike ``hash``, which is salted per process)."""
    key = "/".join(str(part) for part in parts)
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


async def collect(
    tasks: Sequence[Task],
    env: str | EnvFactory,
    engine: Engine,
    builder: TokenBuilder,
    *,
    config: RolloutConfig,
    group_size: int = 1,
    concurrency: int = 64,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    on_trajectory: Callable[[Trajectory], None] | None = None,
) -> list[TrajectoryGroup]:
    """Play ``group_size`` episodes of every task, at most ``concurrency`` at a time.

    Episodes are scheduled individually (no static chunks): a slow episode holds one slot, not a
    batch. Each gets a fresh env from ``env`` (a registered id or a factory). Any failure becomes
    that trajectory's stop reason; siblings go on. Groups come back in task order.
    ``on_trajectory`` is called as each episode finishes (progress bars, streaming writers).
    """
    check_builder(builder, config)
    factory = resolve_env(env, env_kwargs or {}, builder)

    async def play(task: Task, index: int, seed: int) -> list[Trajectory]:
        return await play_one(factory, engine, builder, task, config, index, seed)

    return await gather_groups(tasks, play, group_size, concurrency, seed, on_trajectory)


async def gather_groups(
    tasks: Sequence[Task],
    play: Callable[[Task, int, int], Awaitable[list[Trajectory]]],
    group_size: int,
    concurrency: int,
    seed: int,
    on_trajectory: Callable[[Trajectory], None] | None,
) -> list[TrajectoryGroup]:
    """``play(task, sample index, seed)`` for ``group_size`` samples of every task, at most
    ``concurrency`` at a time, reassembled into groups in task order (:func:`collect`, and
    :class:`~agentloop.loop_workers.LoopWorkers`, whose ``play`` runs in a worker process)."""
    if group_size < 1 or concurrency < 1:
        raise ConfigError(
            f"collect needs group_size >= 1 and concurrency >= 1, got {group_size}, {concurrency}"
        )
    slots = asyncio.Semaphore(concurrency)

    async def one(task: Task, index: int) -> list[Trajectory]:
        async with slots:
            trajectories = await play(task, index, seed)
        if on_trajectory is not None:
            for trajectory in trajectories:
                on_trajectory(trajectory)
        return trajectories

    jobs = [asyncio.ensure_future(one(task, i)) for task in tasks for i in range(group_size)]
    with rollout_gc(episodes=min(concurrency, len(jobs))):
        try:
            results = await asyncio.gather(*jobs)
        except BaseException:  # a failed play (a dead loop worker) stops its siblings too
            for job in jobs:
                job.cancel()
            raise
    return [
        TrajectoryGroup(
            task, tuple(t for r in results[k * group_size : (k + 1) * group_size] for t in r)
        )
        for k, task in enumerate(tasks)
    ]


async def play_one(
    factory: EnvFactory,
    engine: Engine,
    builder: TokenBuilder,
    task: Task,
    config: RolloutConfig,
    index: int,
    seed: int,
) -> list[Trajectory]:
    """One episode of ``task``, sample ``index`` of a batch seeded ``seed`` (:func:`rollout`),
    with anything that escapes it (env construction, template errors) recorded as an
    ``env_error`` trajectory instead of failing the whole batch. An env whose episodes an
    agent program plays (``env.agent_program()``) is played through the proxy: one trajectory
    per segment; under ``thinking=strip`` an episode is one trajectory per turn."""
    try:
        env, episode_seed = factory(), stable_seed(seed, task.id, index)
        if (program := env.agent_program()) is not None:
            from agentloop.proxy.agent import agent_rollout  # aiohttp: only for agent programs

            return await agent_rollout(
                program, engine, builder, task, config, sample_index=index, seed=episode_seed
            )
        return await rollout_episode(
            env, engine, builder, task, config, sample_index=index, seed=episode_seed
        )
    except Exception as exc:
        return [
            Trajectory(
                task_id=task.id,
                token_ids=(),
                loss_mask=(),
                logprobs=(),
                prompt_len=0,
                reward=0.0,
                stop_reason=StopReason.ENV_ERROR,
                error=f"{type(exc).__name__}: {exc}",
                sample_index=index,
            )
        ]


@contextlib.contextmanager
def rollout_gc(episodes: int) -> Iterator[None]:
    """The cyclic GC tuned for a rollout batch of ``episodes`` running at once: the old heap
    frozen, young collections spaced (the two below)."""
    with _old_heap_frozen(), _young_collections_spaced(YOUNG_GC_PER_EPISODE * episodes):
        yield


@contextlib.contextmanager
def _old_heap_frozen() -> Iterator[None]:
    """Keep the cyclic GC off the heap that existed before the batch while it runs.

    A rollout batch allocates fast and keeps its trajectories, so full collections come often,
    and each one rescans the whole process heap — millions of objects once torch, transformers
    or vLLM are loaded: over a third of the loop's CPU for 1,000 concurrent episodes
    (bench/collect_bench.py). Frozen objects are only left out of collections: the heap is handed
    back to the collector afterwards, and the batch's own garbage is collected as usual. A heap
    someone else froze (e.g. before forking workers) is left as it is.
    """
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def _young_collections_spaced(per_batch: int = 0) -> Iterator[None]:
    """Run the youngest GC generation every ``max(_YOUNG_GC_EVERY, per_batch)`` allocations,
    not every 700.

    Running episodes hold their state (messages, token lists, tasks, futures) for their whole
    life, so most objects a young collection walks are live: at the default threshold the
    collector re-walked the same episode state about once per turn, a quarter of the loop's CPU
    with 1,000 concurrent episodes (bench/collect_bench.py), and a third of what was left after
    the freeze. The walk grows with the number of running episodes, so the spacing does too
    (``per_batch``: ``YOUNG_GC_PER_EPISODE`` per running episode); at a fixed 10,000 young
    passes still took about a fifth of the loop's CPU with 1,000 episodes. Cyclic garbage is
    still found, in bigger, rarer passes (at most that many objects of it wait for one). A
    threshold someone set higher is kept; ours is handed back when the batch ends.
    """
    every = max(_YOUNG_GC_EVERY, per_batch)
    young, *older = gc.get_threshold()
    if young == 0 or young >= every:  # 0: automatic collection is off
        yield
        return
    gc.set_threshold(every, *older)
    try:
        yield
    finally:
        if gc.get_threshold()[0] == every:  # not changed by someone meanwhile
            gc.set_threshold(young, *older)


def resolve_env(
    env: str | EnvFactory, env_kwargs: Mapping[str, Any], builder: TokenBuilder
) -> EnvFactory:
    """``env`` as a factory: a registered id is checked now (unknown id, bad kwargs, a builder
    showing other tools) and made with ``env_kwargs`` per episode; a factory is kept as it is."""
    if isinstance(env, str):
        env_id = env
        # fail fast on an unknown id, bad kwargs or a builder made for another env
        _check_tools(builder, make(env_id, **env_kwargs).tool_schemas, env_id)
        return lambda: make(env_id, **env_kwargs)
    if env_kwargs:
        raise ConfigError("env_kwargs apply only to a registered env id, not to a factory")
    return env
