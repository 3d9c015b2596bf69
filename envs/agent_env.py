"""AgentEnv: an env whose episodes are played by an agent program through an OpenAI client.

The agent is any ``async def agent(task, client) -> answer`` written against the official
``openai`` SDK, on chat completions or the Responses API (so OpenAI Agents SDK agents too);
``client`` is an ``openai.AsyncOpenAI`` pointed at agentloop's proxy, which records every
request token-exactly (``agentloop.proxy``). An AgentEnv is its own
:class:`~agentloop.envs.base.AgentProgram`: ``agentloop.collect`` (and so ``agentloop eval`` and
``agentloop train``) plays it by running the agent instead of the step loop;
the tasks and, by default, the reward come from another registered env::

    agentloop eval --env agentloop/Agent-v0 --env-arg agent=my_pkg.my_agent:solve ...
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from agentloop.envs.base import AgentProgram, AnswerHook, Env, StepResult
from agentloop.envs.registry import make
from agentloop.errors import EnvError
from agentloop.types import Message, Task

__all__ = ["AgentEnv", "AgentFn", "AnswerReward", "load_callable"]

#: ``async def agent(task, client) -> answer``; ``client`` is an ``openai.AsyncOpenAI``.
AgentFn = Callable[[Task, Any], Awaitable[str | None]]
#: ``reward(task, answer) -> float``; ``answer`` is None when the agent gave none.
AnswerReward = Callable[[Task, str | None], float]


def load_callable(spec: Callable[..., Any] | str, what: str) -> Callable[..., Any]:
    """``spec`` itself, or the object a ``"package.module:function"`` string names."""
    if callable(spec):
        return spec
    module, sep, attr = str(spec).partition(":")
    if not sep or not module or not attr:
        raise EnvError(f"{what} {spec!r} is not 'package.module:function'")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise EnvError(
            f"{what} {spec!r} cannot be loaded ({exc}); is the module importable "
            "(on PYTHONPATH / installed)?"
        ) from exc
    if not callable(obj):
        raise EnvError(f"{what} {spec!r} is a {type(obj).__name__}, not a function")
    return obj


class AgentEnv(Env):
    """Plays each task by running ``agent(task, client)``; scores its answer with ``reward``.

    - ``agent``: the agent function, or ``"module:function"`` (what YAML configs and
      ``--env-arg agent=...`` pass).
    - ``tasks_from`` / ``tasks_kwargs``: the registered env whose ``tasks(split)`` are played.
    - ``reward``: ``reward(task, answer) -> float`` (or ``"module:function"``); default: the
      ``tasks_from`` env's answer hook, 1.0 when it accepts the answer, else 0.0.
    - ``max_turns``, ``max_tokens``, ``timeout_s``: this env's own ceilings on model requests,
      tokens after the first prompt and wall time; the rollout config's limits apply too (the
      smaller wins).
    - ``model``: the model name the agent's client must ask for.

    ``reset``/``step`` are not used: the agent drives the model itself.
    """

    def __init__(
        self,
        agent: AgentFn | str,
        *,
        reward: AnswerReward | str | None = None,
        tasks_from: str = "agentloop/Calc-v0",
        tasks_kwargs: Mapping[str, Any] | None = None,
        max_turns: int | None = None,
        max_tokens: int | None = None,
        timeout_s: float | None = None,
        model: str = "agentloop",
    ) -> None:
        self.agent: AgentFn = load_callable(agent, "AgentEnv agent")
        self._inner = make(tasks_from, **dict(tasks_kwargs or {}))
        self._hook = self._inner.answer_hook()
        if reward is None and self._hook is None:
            raise EnvError(
                f"AgentEnv: env {tasks_from!r} has no answer hook to score answers with; pass "
                "reward='package.module:function' (reward(task, answer) -> float)"
            )
        self._reward = None if reward is None else load_callable(reward, "AgentEnv reward")
        for name, value in (("max_turns", max_turns), ("max_tokens", max_tokens)):
            if value is not None and value < 1:
                raise EnvError(f"AgentEnv {name} must be >= 1 or None, got {value}")
        if timeout_s is not None and timeout_s <= 0:
            raise EnvError(f"AgentEnv timeout_s must be > 0 or None, got {timeout_s}")
        self.max_turns, self.max_tokens, self.timeout_s = max_turns, max_tokens, timeout_s
        self.model = model

    def score(self, task: Task, answer: str | None) -> float:
        """The episode's reward for the agent's final ``answer``."""
        if self._reward is not None:
            return float(self._reward(task, answer))
        assert self._hook is not None
        extracted = self._hook.extract([Message("assistant", answer or "")])
        return float(extracted is not None and self._hook.check(extracted, task))

    def tasks(self, split: str = "train", limit: int | None = None) -> Sequence[Task]:
        return self._inner.tasks(split, limit)

    def answer_hook(self) -> AnswerHook | None:
        return self._hook

    def agent_program(self) -> AgentProgram:
        return self

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        raise EnvError(_NOT_STEPPED)

    async def step(self, action: Message) -> StepResult:
        raise EnvError(_NOT_STEPPED)

    async def close(self) -> None:
        await self._inner.close()


_NOT_STEPPED = (
    "AgentEnv is played by running its agent, not by reset/step; use agentloop.collect, "
    "`agentloop eval` or `agentloop train`"
)
