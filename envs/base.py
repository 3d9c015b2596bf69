"""The async, gymnasium-style environment contract every agentloop env implements."""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentloop.errors import EnvError
from agentloop.tools import ToolResult
from agentloop.types import Message, Task, Verdict

__all__ = ["AgentProgram", "AnswerHook", "Env", "StepResult"]


@dataclass(frozen=True, slots=True)
class StepResult:
    """What :meth:`Env.step` returns; unpacks like gymnasium's 5-tuple
    (``obs, reward, terminated, truncated, info = result``).

    ``observation`` is the list of new messages for the model (tool results, user follow-ups);
    empty when the episode ended. ``reward`` is this step's reward (the final score comes with
    ``terminated``). What the rollout loop reads is typed: ``tool_results`` (one per tool call
    this step ran, errors included) and ``metrics`` (merged into the trajectory's metrics).
    ``info`` is for the env's own extras; the loop never reads it.
    """

    observation: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)
    tool_results: tuple[ToolResult, ...] = field(default=(), kw_only=True)
    metrics: Mapping[str, float] = field(default_factory=dict, kw_only=True)
    verdict: Verdict | None = field(default=None, kw_only=True)

    def __iter__(self) -> Iterator[Any]:
        """Gymnasium's 5 fields, so ``obs, reward, terminated, truncated, info = result`` works."""
        return iter((self.observation, self.reward, self.terminated, self.truncated, self.info))


@dataclass(frozen=True)
class AnswerHook:
    """How an env's final answer is read (majority voting in ``agentloop eval``):
    ``extract(messages)`` gives the answer or None, ``normalize`` makes equal answers equal
    strings, ``check(answer, task)`` says whether it is right."""

    extract: Callable[[Sequence[Message]], str | None]
    check: Callable[[str, Task], bool]
    normalize: Callable[[str], str] = lambda s: " ".join(s.split())

    def decide(self, answer: str, task: Task, verdict: Verdict | None) -> bool:
        """The reward's own decision where its ``verdict`` read this ``answer`` (no second
        grading: a symbolic check runs off the loop, in the reward), else ``check``."""
        if verdict is not None and verdict.answer == answer:
            return verdict.correct
        return bool(self.check(answer, task))


class AgentProgram(Protocol):
    """An episode that an agent program plays by itself, through an OpenAI-compatible client,
    instead of the loop's ``reset``/``step`` calls (what :meth:`Env.agent_program` returns).

    The loop plays it with ``agentloop.proxy``: the client it hands to ``await agent(task,
    client)`` talks to a loopback proxy in front of the engine, which renders, samples and records
    every request token-exactly; the agent's final answer is scored with ``score(task, answer)``.
    ``max_turns``, ``max_tokens`` (after the first prompt) and ``timeout_s`` are the program's own
    ceilings (None: the rollout config's alone; the smaller wins); ``model`` is the name the
    client must ask for; ``close()`` ends the episode's resources.
    """

    agent: Callable[[Task, Any], Awaitable[str | None]]
    model: str
    max_turns: int | None
    max_tokens: int | None
    timeout_s: float | None

    def score(self, task: Task, answer: str | None) -> float: ...

    async def close(self) -> None: ...


class Env(abc.ABC):
    """One episode at a time, asynchronously — gymnasium's contract with chat messages.

    - ``await reset(seed=..., options={"task": Task})`` starts an episode and returns
      ``(observation, info)``: the initial messages (system, user) and an info dict. Without a task
      in ``options`` the env draws one from ``seed`` (same seed, same task).
    - ``await step(action)`` takes the assistant :class:`Message` (raw text + parsed tool calls)
      and returns a :class:`StepResult`. ``terminated``: the episode reached an end state and was
      scored. ``truncated``: the env's own limit cut it.
    - ``await close()`` releases per-episode resources (tool sessions); it is called on every exit
      path, including cancellation, and must be safe to call twice.
    - ``await preflight()`` checks the services the env needs (sandbox servers, ...) once, before
      the first episode of an eval or training run; it raises a clear error naming what is wrong.
    - ``tool_schemas`` are the OpenAI-style function schemas the chat template shows the model.
    - ``tasks(split, limit)`` lists the env's dataset, for training and offline evaluation.
    - ``answer_hook()`` says how to read the final answer for majority voting (None: the env
      has no comparable answers; ``agentloop eval`` then reports rewards only).
    - ``agent_program()``: an env whose episodes an agent program plays (:class:`AgentProgram`)
      returns it, and the loop plays that instead of calling ``reset``/``step``; default: None.

    An env instance plays one episode at a time; the rollout makes one instance per episode.
    """

    #: Set by :func:`agentloop.envs.make` to the registered id.
    env_id: str | None = None

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return []

    @abc.abstractmethod
    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]: ...

    @abc.abstractmethod
    async def step(self, action: Message) -> StepResult: ...

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release per-episode resources. Default: nothing to release."""

    async def preflight(self) -> None:  # noqa: B027 - optional hook, nothing to check by default
        """Check the env's services before the first episode. Default: nothing to check."""

    def tasks(self, split: str = "train", limit: int | None = None) -> Sequence[Task]:
        raise EnvError(
            f"{type(self).__name__} has no dataset; pass tasks explicitly or implement tasks()"
        )

    def answer_hook(self) -> AnswerHook | None:
        """How to read this env's final answers (majority voting); default: None."""
        return None

    def agent_program(self) -> AgentProgram | None:
        """The agent program that plays this env's episodes, if one does; default: None (the
        loop plays the episode with ``reset``/``step``)."""
        return None
