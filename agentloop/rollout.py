"""The rollout loop: play one episode of an env with an engine and return a token-exact Trajectory.

This is the only place where generation, tool calls and token accounting meet. Training,
validation and ``agentloop eval`` all call :func:`rollout` (through :func:`agentloop.collect`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from agentloop.chat import TokenBuilder
from agentloop.engines.base import Engine, SamplingParams, generate
from agentloop.envs import Env, StepResult
from agentloop.errors import ConfigError, ToolFatalError
from agentloop.tools import get_parser, truncate_to_tokens
from agentloop.tools.recording import episode_scope
from agentloop.types import Completion, Message, StopReason, Task, Trajectory, Turn

__all__ = ["RolloutConfig", "rollout"]

log = logging.getLogger(__name__)
R = TypeVar("R")
# Tool output up to this many characters is cut on the event loop (well under 10 ms of
# tokenizing); more goes to a worker thread.
_INLINE_CHARS = 16_384


@dataclass(frozen=True)
class RolloutConfig:
    """Limits and sampling for episodes — the same for training, validation and eval. An
    episode that reaches a limit ends with that stop reason; its trajectory is kept."""

    max_turns: int = 8
    """Model turns (a generation, then its tool calls) per episode (>= 1); after the last one
    the episode stops with ``max_turns``."""
    max_prompt_len: int = 1024
    """Tokens of the first prompt (system, tools, task) (>= 1); a longer prompt ends the
    episode with ``context_overflow`` before any generation."""
    max_response_len: int = 1024
    """Tokens after the prompt (>= 1), sampled *and* observation tokens together; each turn
    samples at most what is left, and an observation that does not fit ends the episode."""
    max_tool_output_tokens: int = 256
    """A tool message longer than this many tokens (>= 1) is cut, with a visible marker,
    before the model sees it."""
    timeout_s: float = 300.0
    """Deadline in seconds for the whole episode, engine and tool calls included (> 0); past
    it the episode stops with ``timeout``."""
    temperature: float = 1.0
    """Sampling temperature (>= 0; 0 is greedy). Training needs > 0, equal to
    ``actor.temperature``."""
    top_p: float = 1.0
    """Nucleus sampling: sample from the most likely tokens holding this much probability, in
    (0, 1]; 1: off."""
    top_k: int = -1
    """Sample from the k most likely tokens (>= 1); -1: off."""
    parser: str = "auto"
    """Tool-call parser that reads calls out of the model's text: ``auto`` (the one the chat
    template's format implies; an unrecognised template with tools is an error) or a name
    registered with ``@register_parser`` (built in: ``hermes``, ``llama3_json``, ``mistral``,
    ``harmony``, ``glm45``, ``qwen3_coder``, ``deepseek_v3``)."""
    check_template: bool = False
    """After each episode, check that its token ids decode to the chat template's rendering
    of its messages (a mismatch raises ``TemplateError``); a debugging aid, one render per
    episode."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_prompt_len", "max_response_len", "max_tool_output_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        if self.timeout_s <= 0:
            raise ConfigError(f"rollout.timeout_s must be > 0, got {self.timeout_s}")
        SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        if self.parser != "auto":
            get_parser(self.parser)  # unknown parser names fail here, with a did-you-mean

    def sampling(self, max_tokens: int, seed: int | None, stop: tuple[int, ...]) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=seed,
            stop_token_ids=stop,
        )


class _Stop(Exception):
    """Ends an episode with a stop reason (and an error text for failures)."""

    def __init__(self, reason: StopReason, error: str | None = None) -> None:
        super().__init__(reason, error)
        self.reason, self.error = reason, error


@dataclass
class _Episode:
    """Mutable accumulator behind one Trajectory; whatever was built survives a failure."""

    task_id: str
    sample_index: int
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_len: int = 0
    messages: list[Message] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    images: list[Any] = field(default_factory=list)
    image_grids: list[tuple[int, int, int]] = field(default_factory=list)
    versions: list[int] | None = field(default_factory=list)  # None: an engine gave none

    def add_images(self, messages: list[Message], builder: TokenBuilder) -> None:
        """Record the images of messages just appended, in token order (VLM episodes)."""
        images = [im for m in messages for im in m.images]
        if images:  # a text turn skips the builder (which names a missing vision processor)
            self.images.extend(images)
            self.image_grids.extend(builder.image_grids(messages))

    def count_tool_errors(self, result: StepResult) -> None:
        for r in result.tool_results:
            if r.error_kind is not None:
                key = f"tool_error/{r.error_kind}"
                self.metrics[key] = self.metrics.get(key, 0.0) + 1.0

    @property
    def response_len(self) -> int:
        return len(self.token_ids) - self.prompt_len

    def append(self, ids: list[int] | tuple[int, ...], *, sampled: Completion | None) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(sampled.logprobs if sampled else [0.0] * len(ids))
        if self.versions is not None:
            if sampled is not None and not sampled.versions:
                self.versions = None  # the engine tracks no policy versions
            else:
                self.versions.extend(sampled.versions if sampled else [-1] * len(ids))

    def build(self, reason: StopReason, error: str | None) -> Trajectory:
        metrics = {
            "turns": float(len(self.turns)),
            "response_tokens": float(self.response_len),
            "trained_tokens": float(self.loss_mask.count(1)),  # the mask holds only 0 and 1
            "gen_time_s": sum(t.gen_latency_s for t in self.turns),
            "env_time_s": sum(t.env_latency_s for t in self.turns),
        }
        if self.turns:
            metrics["tool_calls"] = float(sum(t.tool_calls for t in self.turns))
            metrics["tool_errors"] = float(sum(t.tool_errors for t in self.turns))
        metrics.update(self.metrics)
        return Trajectory(
            task_id=self.task_id,
            token_ids=tuple(self.token_ids),
            loss_mask=tuple(self.loss_mask),
            logprobs=tuple(self.logprobs),
            prompt_len=self.prompt_len,
            reward=self.reward,
            stop_reason=reason,
            turns=tuple(self.turns),
            messages=tuple(self.messages),
            metrics=metrics,
            error=error,
            sample_index=self.sample_index,
            images=tuple(self.images),
            image_grids=tuple(self.image_grids),
            versions=tuple(self.versions or ()),
        )


async def rollout(
    env: Env,
    engine: Engine,
    builder: TokenBuilder,
    task: Task,
    config: RolloutConfig,
    *,
    sample_index: int = 0,
    seed: int | None = None,
) -> Trajectory:
    """Play one episode of ``task`` and return its trajectory. Never raises for episode failures
    (engine, env, tool, reward errors, the deadline): they end the episode with a stop reason and
    an ``error`` text. Cancellation propagates. ``env`` is closed on every exit path."""
    episode = _Episode(task.id, sample_index)
    reason, error = StopReason.DONE, None
    try:
        # episode_scope: the env's tool session learns which episode it serves (tool record/replay)
        async with asyncio.timeout(config.timeout_s):
            with episode_scope(task.id, sample_index):
                await _play(episode, env, engine, builder, task, config, seed)
    except _Stop as stop:
        reason, error = stop.reason, stop.error
    except TimeoutError:
        reason, error = StopReason.TIMEOUT, f"episode exceeded rollout.timeout_s={config.timeout_s}"
    finally:
        await _close(env, episode)
    if config.check_template and episode.turns and not reason.is_error:
        builder.check_text(episode.token_ids, episode.messages)
    trajectory = episode.build(reason, error)
    if builder.vision is not None:  # placeholder runs must match the image grids, always
        from agentloop.vision import check_image_placeholders

        check_image_placeholders(
            trajectory.token_ids,
            trajectory.image_grids,
            image_token_id=builder.vision.tokens.image,
            merge_size=builder.vision.merge_size,
        )
    return trajectory


async def _play(
    episode: _Episode,
    env: Env,
    engine: Engine,
    builder: TokenBuilder,
    task: Task,
    config: RolloutConfig,
    seed: int | None,
) -> None:
    """The loop itself. Always ends by raising :class:`_Stop`."""
    parser = get_parser(builder.parser_for(config.parser))
    messages, _ = await _env_call(env.reset(seed=seed, options={"task": task}))
    episode.messages.extend(messages)
    prompt = builder.prompt_ids(messages)
    if len(prompt) > config.max_prompt_len:
        raise _Stop(
            StopReason.CONTEXT_OVERFLOW,
            f"prompt has {len(prompt)} tokens > rollout.max_prompt_len={config.max_prompt_len}",
        )
    episode.append(prompt, sampled=None)
    episode.prompt_len = len(prompt)
    episode.add_images(messages, builder)
    session_id = f"{task.id}#{episode.sample_index}"
    for turn in range(config.max_turns):
        budget = config.max_response_len - episode.response_len
        turn_seed = None if seed is None else seed * 1009 + turn
        sampling = config.sampling(budget, turn_seed, builder.stop_token_ids)
        if builder.banned_token_ids:
            sampling = sampling.with_(banned_token_ids=builder.banned_token_ids)
        start, t0 = len(episode.token_ids), time.perf_counter()
        completion = await _generate(
            engine, episode.token_ids, sampling, session_id, episode.images
        )
        episode.append(completion.token_ids, sampled=completion)
        text = builder.decode(completion.token_ids)
        action = Message("assistant", text, parser.parse(text))
        episode.messages.append(action)
        t1 = time.perf_counter()
        result = await _env_call(env.step(action))
        reward = _finite_reward(result.reward)
        episode.reward += reward
        episode.metrics.update(result.metrics)
        obs = await _fit_observation(result, builder, config)
        stop = _stop_reason(completion, result, obs)
        obs_ids = builder.observation_ids(obs, completion.token_ids) if stop is None else []
        if stop is None and any(m.images for m in obs):
            obs, obs_ids = _drop_images_to_fit(episode, obs, obs_ids, builder, completion, config)
        episode.turns.append(_turn(turn, start, completion, result, len(obs_ids), t0, t1, reward))
        episode.count_tool_errors(result)
        if stop is not None:
            raise _Stop(stop)
        if episode.response_len + len(obs_ids) >= config.max_response_len:
            raise _Stop(
                StopReason.MAX_TOKENS,
                f"observation of {len(obs_ids)} tokens does not fit the remaining response budget",
            )
        episode.messages.extend(obs)
        episode.append(obs_ids, sampled=None)
        episode.add_images(obs, builder)
    raise _Stop(StopReason.MAX_TURNS)


def _stop_reason(
    completion: Completion, result: StepResult, obs: list[Message]
) -> StopReason | None:
    """Why the episode ends after this step, or None to continue with ``obs``."""
    if completion.finish_reason == "length":
        return StopReason.MAX_TOKENS  # the env still scored the cut reply
    if result.terminated:
        return StopReason.DONE
    if result.truncated:
        return StopReason.TRUNCATED
    return None if obs else StopReason.DONE  # nothing to answer: the episode is over


async def _generate(
    engine: Engine, ids: list[int], sampling: SamplingParams, session_id: str, images: list[Any]
) -> Completion:
    if images and not engine.supports_images:
        raise _Stop(
            StopReason.ENGINE_ERROR,
            f"the episode has {len(images)} images but {type(engine).__name__} does not take "
            "images; use an engine with supports_images (HFEngine or VLLMEngine with a VLM)",
        )
    try:
        completion = await generate(
            engine, ids, sampling, session_id=session_id, images=tuple(images)
        )
    except Exception as exc:  # any engine failure is this episode's data, not the batch's crash
        raise _Stop(StopReason.ENGINE_ERROR, f"{type(exc).__name__}: {exc}") from exc
    if not completion.token_ids:
        raise _Stop(StopReason.ENGINE_ERROR, "engine returned an empty completion")
    return completion


async def _env_call(awaitable: Awaitable[R]) -> R:
    """Await an env call; a fatal tool error or any env/reward failure ends the episode.

    A ``CancelledError`` that nobody asked for (env or tool code raising it itself), a
    ``KeyboardInterrupt`` or a ``SystemExit`` is this episode's failure too: passed on, it would
    cancel the whole ``collect`` or stop the event loop."""
    try:
        return await awaitable
    except ToolFatalError as exc:
        raise _Stop(StopReason.TOOL_FATAL, str(exc)) from exc
    except Exception as exc:
        raise _Stop(StopReason.ENV_ERROR, f"{type(exc).__name__}: {exc}") from exc
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is None or task.cancelling():  # a real cancellation: the deadline or the caller
            raise
        raise _Stop(
            StopReason.ENV_ERROR, "the env raised CancelledError without being cancelled"
        ) from exc
    except (KeyboardInterrupt, SystemExit) as exc:
        # Ctrl-C reaches asyncio.run as a cancellation of its main task, never as this raise:
        # one raised here is env or reward code's own, and would stop every episode's loop.
        raise _Stop(
            StopReason.ENV_ERROR, f"the env raised {type(exc).__name__}; it must not"
        ) from exc


def _finite_reward(reward: float) -> float:
    """The step's reward as a float; NaN or infinity ends the episode (it would void the
    whole training step's advantages)."""
    value = float(reward)
    if not math.isfinite(value):
        raise _Stop(
            StopReason.ENV_ERROR,
            f"the env returned a non-finite reward ({value}); rewards must be finite numbers",
        )
    return value


async def _fit_observation(
    result: StepResult, builder: TokenBuilder, config: RolloutConfig
) -> list[Message]:
    """Tool outputs cut to ``max_tool_output_tokens`` with a visible marker; others unchanged.

    Huge outputs are cut by characters before tokenizing (``builder.max_token_chars``), and
    tokenizing more than ``_INLINE_CHARS`` runs on a worker thread: no episode waits on
    another's megabytes (the tokenizer releases the GIL for long pieces)."""
    chars = sum(len(m.content) for m in result.observation if m.role == "tool")
    if chars <= _INLINE_CHARS:
        return _fit_tool_messages(result.observation, builder, config)
    builder.max_token_chars  # noqa: B018 -- computed once here, not racing on worker threads
    return await asyncio.to_thread(_fit_tool_messages, result.observation, builder, config)


def _fit_tool_messages(
    observation: Sequence[Message], builder: TokenBuilder, config: RolloutConfig
) -> list[Message]:
    out = []
    for m in observation:
        if m.role == "tool":
            content = truncate_to_tokens(
                m.content,
                config.max_tool_output_tokens,
                builder.encode,
                builder.decode,
                max_token_chars=builder.max_token_chars,
            )
            if content is not m.content:  # cut: a new message, keeping the tool's images
                m = replace(m, content=content)
        out.append(m)
    return out


def _drop_images_to_fit(
    episode: _Episode,
    obs: list[Message],
    obs_ids: list[int],
    builder: TokenBuilder,
    completion: Completion,
    config: RolloutConfig,
) -> tuple[list[Message], list[int]]:
    """Drop observation images, last first and whole, until the observation fits the response
    budget. An image is never cut: its placeholder run is all there or not at all; a visible
    note in the message text tells the model it was dropped."""
    left = config.max_response_len - episode.response_len
    obs = list(obs)
    while len(obs_ids) >= left and any(m.images for m in obs):
        k = max(i for i, m in enumerate(obs) if m.images)
        m = obs[k]
        w, h = m.images[-1].size
        note = f"[image {w}x{h} dropped: the response budget has {left} tokens left]"
        obs[k] = replace(m, images=m.images[:-1], content=f"{note}\n{m.content}".rstrip("\n"))
        episode.metrics["images_dropped"] = episode.metrics.get("images_dropped", 0.0) + 1.0
        obs_ids = builder.observation_ids(obs, completion.token_ids)
    return obs, obs_ids


def _turn(
    index: int,
    start: int,
    completion: Completion,
    result: StepResult,
    obs_tokens: int,
    t0: float,
    t1: float,
    reward: float,
) -> Turn:
    tool_results = result.tool_results
    return Turn(
        index=index,
        start=start,
        completion_tokens=len(completion.token_ids),
        observation_tokens=obs_tokens,
        finish_reason=completion.finish_reason,
        tool_calls=len(tool_results),
        tool_errors=sum(1 for r in tool_results if r.error_kind is not None),
        gen_latency_s=t1 - t0,
        env_latency_s=time.perf_counter() - t1,
        reward=reward,
    )


async def _close(env: Env, episode: _Episode) -> None:
    try:
        await env.close()
    except Exception:  # a failing close must not lose the trajectory
        log.exception("env.close() failed for task %s", episode.task_id)
        episode.metrics["env_close_errors"] = 1.0
