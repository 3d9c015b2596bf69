"""The rollout loop: play one episode of an env with an engine and return token-exact trajectories.

This is the only place where generation, tool calls and token accounting meet. Training,
validation and ``agentloop eval`` all call :func:`rollout_episode` (through
:func:`agentloop.collect`). An episode is one trajectory, or, under ``rollout.thinking=strip``
with a template that rewrites history, one trajectory per turn (see :func:`rollout_episode`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from agentloop.chat import TokenBuilder
from agentloop.engines.base import Engine, SamplingParams, generate
from agentloop.envs import Env, StepResult
from agentloop.errors import ConfigError, ToolFatalError
from agentloop.rollout_state import EpisodeState
from agentloop.thinking import check_thinking
from agentloop.tools import ToolSchemas, get_parser, truncate_to_tokens
from agentloop.tools.recording import episode_scope
from agentloop.types import Completion, Message, StopReason, Task, Trajectory, Turn

__all__ = ["RolloutConfig", "check_builder", "rollout", "rollout_episode"]

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
    max_turn_tokens: int | None = None
    """Tokens one model turn may sample (>= 1): each turn samples at most this many, or what is
    left of ``max_response_len`` if less. A turn cut at this cap is a finished turn: the env
    steps on it and the episode goes on (one cut by ``max_response_len`` ends it with
    ``max_tokens``). None: off (a turn may sample all that is left)."""
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
    episode. Skipped for a template that rewrites history (under ``thinking`` keep or strip)."""
    thinking: str = "auto"
    """Thinking-history policy, for chat templates that rewrite history (Qwen3- and R1-style
    templates drop earlier turns' ``<think>`` blocks): ``auto`` (such a template is an error at
    start-up; prefix-stable ones just work), ``keep`` (earlier reasoning stays in the prompt:
    one trajectory per episode, a history the model will not see at inference) or ``strip``
    (each turn's prompt is the template's own rendering of the history: one training sample
    per turn). The TokenBuilder must be made with the same value (``thinking=``)."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_prompt_len", "max_response_len", "max_tool_output_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_turn_tokens is not None and self.max_turn_tokens < 1:
            raise ConfigError(
                f"rollout.max_turn_tokens must be >= 1 or null (off), got {self.max_turn_tokens}"
            )
        if self.timeout_s <= 0:
            raise ConfigError(f"rollout.timeout_s must be > 0, got {self.timeout_s}")
        SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        if self.parser != "auto":
            get_parser(self.parser)  # unknown parser names fail here, with a did-you-mean
        check_thinking(self.thinking)

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


def check_builder(builder: TokenBuilder, config: RolloutConfig) -> None:
    """A ``ConfigError`` if ``builder`` was made with another thinking-history policy than
    ``config.thinking`` while its template needs one (it rewrites history)."""
    if builder.rewrites_history is not None and builder.thinking != config.thinking:
        raise ConfigError(
            f"rollout.thinking={config.thinking} but the TokenBuilder was made with "
            f"thinking={builder.thinking!r}; make it with TokenBuilder(..., "
            f"thinking={config.thinking!r})"
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
    """:func:`rollout_episode` for an episode that is one trajectory (a builder that does not
    split turns; with ``builder.splits_turns`` use :func:`rollout_episode`)."""
    if builder.splits_turns:
        raise ConfigError(
            "rollout() returns one trajectory, but under thinking=strip an episode is one "
            "sample per turn; call rollout_episode() (or collect())"
        )
    (trajectory,) = await rollout_episode(
        env, engine, builder, task, config, sample_index=sample_index, seed=seed
    )
    return trajectory


async def rollout_episode(
    env: Env,
    engine: Engine,
    builder: TokenBuilder,
    task: Task,
    config: RolloutConfig,
    *,
    sample_index: int = 0,
    seed: int | None = None,
) -> list[Trajectory]:
    """Play one episode of ``task`` and return its trajectories. Never raises for episode
    failures (engine, env, tool, reward errors, the deadline): they end the episode with a stop
    reason and an ``error`` text. Cancellation propagates. ``env`` is closed on every exit path.

    Usually the episode is one trajectory. Under ``thinking=strip`` with a template that
    rewrites history (``builder.splits_turns``) it is one trajectory per turn, in turn order,
    all with this ``sample_index``: turn k's prompt is the template's own rendering of the
    history (earlier reasoning dropped, as at inference), encoded once and given to the engine
    as it is, and its response is that turn's sampled ids and logprobs (``loss_mask`` 1 on them
    only). As with a proxied agent's segments, every sample carries the episode's reward, stop
    reason and env metrics (outcome advantages score each sample with the episode's reward),
    its own turn (with that turn's reward, and ``Turn.index`` its position in the episode, so
    ``turn_rloo`` gives each sample its own turn's advantage), and ``segments``/
    ``segment_index`` metrics (the last sample, holding the whole conversation, stands for the
    episode in eval). The response budget counts the current context after the first prompt.
    """
    check_builder(builder, config)
    episode = EpisodeState(task.id, sample_index)
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
    stable = builder.rewrites_history is None
    if config.check_template and stable and episode.turns and not reason.is_error:
        builder.check_text(episode.token_ids, episode.messages)
    trajectories = episode.build(reason, error)
    if builder.vision is not None:  # placeholder runs must match the image grids, always
        from agentloop.vision import check_image_placeholders

        for trajectory in trajectories:
            check_image_placeholders(
                trajectory.token_ids,
                trajectory.image_grids,
                image_token_id=builder.vision.tokens.image,
                merge_size=builder.vision.merge_size,
            )
    return trajectories


def _score(episode: EpisodeState, result: StepResult) -> float:
    """Add a step's reward, metrics and verdict to the episode; the step's finite reward."""
    reward = _finite_reward(result.reward)
    episode.reward += reward
    episode.metrics.update(result.metrics)
    if result.verdict is not None:
        episode.verdict = result.verdict
    return reward


async def _play(
    episode: EpisodeState,
    env: Env,
    engine: Engine,
    builder: TokenBuilder,
    task: Task,
    config: RolloutConfig,
    seed: int | None,
) -> None:
    """The loop itself. Always ends by raising :class:`_Stop`."""
    parser = get_parser(builder.parser_for(config.parser))
    schemas = ToolSchemas.of(builder.tools)  # what untyped formats' values are typed by
    await _reset(episode, env, builder, task, config, seed)
    session_id = f"{task.id}#{episode.sample_index}"
    for turn in range(config.max_turns):
        sampling = _turn_sampling(episode, builder, config, seed, turn)
        capped = sampling.max_tokens < config.max_response_len - episode.response_len
        start, t0 = len(episode.token_ids), time.perf_counter()
        completion = await _generate(
            engine, episode.token_ids, sampling, session_id, episode.images
        )
        episode.append(completion.token_ids, sampled=completion)
        text = builder.decode(completion.token_ids)
        action = Message("assistant", text, parser.parse(text, schemas))
        episode.messages.append(action)
        t1 = time.perf_counter()
        result = await _env_call(env.step(action))
        reward = _score(episode, result)
        obs = await _fit_observation(result, builder, config)
        stop = _stop_reason(completion, result, obs, capped)
        obs_ids, history = [], []  # the next context: a suffix, or (strip) a fresh rendering
        if stop is None and builder.splits_turns:
            history = await _render_history(builder, [*episode.messages, *obs])
        elif stop is None:
            obs_ids = builder.observation_ids(obs, completion.token_ids)
            if any(m.images for m in obs):
                obs, obs_ids = _drop_images_to_fit(
                    episode, obs, obs_ids, builder, completion, config
                )
        episode.turns.append(_turn(turn, start, completion, result, len(obs_ids), t0, t1, reward))
        episode.count_tool_errors(result)
        if stop is not None:
            raise _Stop(stop)
        after = len(history) if history else len(episode.token_ids) + len(obs_ids)
        if after - episode.base_len >= config.max_response_len:
            raise _Stop(
                StopReason.MAX_TOKENS,
                f"observation of {after - len(episode.token_ids)} tokens does not fit the "
                "remaining response budget",
            )
        if history:
            episode.restart(history, [*episode.messages, *obs], builder)
            continue
        episode.messages.extend(obs)
        episode.append(obs_ids, sampled=None)
        episode.add_images(obs, builder)
    raise _Stop(StopReason.MAX_TURNS)


def _turn_sampling(
    episode: EpisodeState,
    builder: TokenBuilder,
    config: RolloutConfig,
    seed: int | None,
    turn: int,
) -> SamplingParams:
    """Turn ``turn``'s sampling: what is left of the response budget (at most
    ``max_turn_tokens``), a seed per turn, the template's stop tokens and banned tokens."""
    budget = config.max_response_len - episode.response_len
    if config.max_turn_tokens is not None:
        budget = min(budget, config.max_turn_tokens)
    turn_seed = None if seed is None else seed * 1009 + turn
    sampling = config.sampling(budget, turn_seed, builder.stop_token_ids)
    if builder.banned_token_ids:
        sampling = sampling.with_(banned_token_ids=builder.banned_token_ids)
    return sampling


async def _reset(
    episode: EpisodeState,
    env: Env,
    builder: TokenBuilder,
    task: Task,
    config: RolloutConfig,
    seed: int | None,
) -> None:
    """Reset the env on ``task`` and start the episode with its prompt (raises :class:`_Stop`
    when the prompt is longer than ``max_prompt_len``)."""
    messages, _ = await _env_call(env.reset(seed=seed, options={"task": task}))
    episode.messages.extend(messages)
    prompt = builder.prompt_ids(messages)
    if len(prompt) > config.max_prompt_len:
        raise _Stop(
            StopReason.CONTEXT_OVERFLOW,
            f"prompt has {len(prompt)} tokens > rollout.max_prompt_len={config.max_prompt_len}",
        )
    episode.append(prompt, sampled=None)
    episode.prompt_len = episode.base_len = len(prompt)
    episode.add_images(messages, builder)


def _stop_reason(
    completion: Completion, result: StepResult, obs: list[Message], capped: bool
) -> StopReason | None:
    """Why the episode ends after this step, or None to continue with ``obs`` (``capped``: the
    turn's limit was ``max_turn_tokens``, not the response budget, so a cut there goes on)."""
    if completion.finish_reason == "length" and not capped:
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


async def _render_history(builder: TokenBuilder, messages: list[Message]) -> list[int]:
    """The template's rendering of the whole history, encoded (``thinking=strip``); a long
    history renders on a worker thread, so other episodes do not wait on it."""
    if sum(len(m.content) for m in messages) <= _INLINE_CHARS:
        return builder.prompt_ids(messages)
    return await asyncio.to_thread(builder.prompt_ids, messages)


async def _fit_observation(
    result: StepResult, builder: TokenBuilder, config: RolloutConfig
) -> list[Message]:
    """Tool outputs cut to ``max_tool_output_tokens`` with a visible marker (a text model's
    tool images become a notice); others unchanged.

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
            if m.images and builder.vision is None:  # a text model: a notice, not a failure
                note = f"[{len(m.images)} image(s) not shown: this model reads text only]"
                m = replace(m, images=(), content=f"{note}\n{m.content}".rstrip("\n"))
        out.append(m)
    return out


def _drop_images_to_fit(
    episode: EpisodeState,
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


async def _close(env: Env, episode: EpisodeState) -> None:
    try:
        await env.close()
    except Exception:  # a failing close must not lose the trajectory
        log.exception("env.close() failed for task %s", episode.task_id)
        episode.metrics["env_close_errors"] = 1.0
