"""ToolEnv: multi-turn env that dispatches tool calls to a toolset and scores the answer."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from agentloop.envs.base import Env, StepResult
from agentloop.envs.rewards import Reward, RewardFn
from agentloop.envs.task_files import prompt_messages
from agentloop.errors import ConfigError, EnvError, RewardError
from agentloop.tools import Tool, ToolResult, ToolSession, Toolset
from agentloop.types import Message, Task

__all__ = ["ToolEnv"]


class ToolEnv(Env):
    """Ask a question, run the model's tool calls, score the first reply without tool calls.

    - ``reset`` opens a per-episode tool session (released by ``close`` on every exit path) and
      returns ``[system, user]`` built by :meth:`prompt` from the task.
    - ``step``: tool calls in the action run concurrently; their results come back as ``tool``
      messages (errors included, named, so the model can fix its call). A reply with no tool
      calls ends the episode (``terminated``) and is scored by ``reward_fn(task, messages)``.
    - ``max_turns`` (optional) truncates the episode after that many assistant turns, scored too.

    Subclasses override :meth:`prompt`, :meth:`sample_task` and :meth:`tasks`.
    """

    def __init__(
        self,
        tools: Sequence[Tool] | Toolset,
        reward_fn: RewardFn,
        *,
        system_prompt: str | None = None,
        max_turns: int | None = None,
    ) -> None:
        if max_turns is not None and max_turns < 1:
            raise EnvError(f"max_turns must be >= 1 or None, got {max_turns}")
        self.toolset = tools if isinstance(tools, Toolset) else Toolset(list(tools))
        self.reward_fn = reward_fn
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self._session_cm: contextlib.AbstractAsyncContextManager[ToolSession] | None = None
        self._session: ToolSession | None = None
        self._task: Task | None = None
        self._messages: list[Message] = []
        self._turns = 0

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return self.toolset.schemas

    def add_tools(self, tools: Sequence[Tool], *, replace: Collection[str] = ()) -> None:
        """Add ``tools`` (e.g. an MCP server's, ``agentloop eval --tools``) to the env's. One named
        like a tool of the env replaces it only when ``replace`` names it (an MCP spec's
        ``replace=NAME``), so a built-in tool can be served by another backend on request;
        any other clash is a ``ConfigError`` naming both tools and the fix."""
        merged = {t.name: t for t in self.toolset}
        for t in tools:
            own = merged.get(t.name)
            if own is not None and t.name not in replace and own not in tools:
                raise ConfigError(
                    f"the added tool {t.name!r} from {t.origin} has the name of the env's own "
                    f"tool {t.name!r} ({own.origin}); to serve the env's tool from it, ask for "
                    f"that with replace={t.name} (mcp[replace={t.name}]:SERVER), or leave it out "
                    "with include=... (mcp[include=A+B]:SERVER)"
                )
            merged[t.name] = t
        self.toolset = Toolset(list(merged.values()), max_parallel=self.toolset.max_parallel)

    def prompt(self, task: Task) -> list[Message]:
        """Initial messages for ``task``: the system prompt (if any, and the task brings no system
        message) and ``task.data["prompt"]`` (a string, or chat messages as verl's rows hold)."""
        if "prompt" not in task.data:
            raise EnvError(
                f"task {task.id!r} has no 'prompt' field (fields: {sorted(task.data)}); "
                "add one or override ToolEnv.prompt()"
            )
        return prompt_messages(task, self.system_prompt)

    def sample_task(self, seed: int | None) -> Task:
        """The task for ``reset(seed=...)`` without an explicit task."""
        tasks = self.tasks("train")
        if not tasks:
            raise EnvError(f"{type(self).__name__} has no tasks to sample from")
        return tasks[(seed or 0) % len(tasks)]

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        await self.close()
        task = (options or {}).get("task") or self.sample_task(seed)
        if not isinstance(task, Task):
            raise EnvError(f"options['task'] must be an agentloop Task, got {type(task).__name__}")
        self._task, self._turns = task, 0
        self._session_cm = self.toolset.session(task=task)
        self._session = await self._session_cm.__aenter__()
        self._messages = self.prompt(task)
        return list(self._messages), {"task_id": task.id}

    async def step(self, action: Message) -> StepResult:
        if self._session is None or self._task is None:
            raise EnvError("step() called before reset(); call reset() first")
        self._messages.append(action)
        self._turns += 1
        if not action.tool_calls:
            return await self._finish(terminated=True)
        results = tuple(await self._session.dispatch(action.tool_calls))
        observation = [r.to_message() for r in results]
        self._messages.extend(observation)
        if self.max_turns is not None and self._turns >= self.max_turns:
            return await self._finish(terminated=False, tool_results=results)
        return StepResult(observation, 0.0, False, False, tool_results=results)

    async def preflight(self) -> None:
        """Run each tool's ``preflight`` (the code interpreter starts its sandbox)."""
        for t in self.toolset:
            if t.preflight is not None:
                await t.preflight()

    async def close(self) -> None:
        cm, self._session_cm, self._session = self._session_cm, None, None
        if cm is not None:
            await cm.__aexit__(None, None, None)

    async def _finish(
        self, *, terminated: bool, tool_results: tuple[ToolResult, ...] = ()
    ) -> StepResult:
        assert self._task is not None
        reward = await self.score(self._task, self._messages)
        metrics = dict(reward.metrics)
        return StepResult(
            [],
            reward.value,
            terminated,
            not terminated,
            tool_results=tool_results,
            metrics=metrics,
            verdict=reward.verdict,
        )

    async def score(self, task: Task, messages: Sequence[Message]) -> Reward:
        """Run ``reward_fn``; failures become :class:`RewardError` naming the task."""
        try:
            value = self.reward_fn(task, messages)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            raise RewardError(f"reward_fn failed on task {task.id!r}: {exc!r}") from exc
        if isinstance(value, Reward):
            return value
        if isinstance(value, int | float):
            return Reward(float(value))
        raise RewardError(
            f"reward_fn returned {type(value).__name__} for task {task.id!r}; "
            "return a float or agentloop.envs.Reward"
        )
