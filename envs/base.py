"""The async, gymnasium-style environment contract every agentloop env implements."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from agentloop.errors import EnvError
from agentloop.types import Message, Task

__all__ = ["Env", "StepResult"]


class StepResult(NamedTuple):
    """What :meth:`Env.step` returns; unpacks like gymnasium's 5-tuple.

    ``observation`` is the list of new messages for the model (tool results, user follow-ups);
    empty when the episode ended. ``reward`` is this step's reward (the final score comes with
    ``terminated``). ``info`` may carry ``"tool_results"`` (list of ``ToolResult``) and
    ``"metrics"`` (``dict[str, float]`` merged into the trajectory's metrics).
    """

    observation: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


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
    - ``tool_schemas`` are the OpenAI-style function schemas the chat template shows the model.
    - ``tasks(split, limit)`` lists the env's dataset, for training and offline evaluation.

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

    def tasks(self, split: str = "train", limit: int | None = None) -> Sequence[Task]:
        raise EnvError(
            f"{type(self).__name__} has no dataset; pass tasks explicitly or implement tasks()"
        )
