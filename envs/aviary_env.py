"""aviary's environments, unchanged, as agentloop envs: ``aviary:<name>`` (``fhaviary`` on PyPI).

aviary (FutureHouse) plays an env as ``env = Environment.from_name(name, **kwargs)``, ``msgs,
tools = await env.reset()`` and ``await env.step(ToolRequestMessage)`` per model turn, returning
``(observations, reward, done, truncated)``. This adapter does the same from agentloop's loop: the
tools reset returns are the ones the chat template shows (the first task's, checked against every
episode's), the parsed tool calls go to ``step`` as aviary's ``ToolRequestMessage`` (a reply with
none as a plain assistant message, which aviary answers itself), its observations come back as
masked tool/user turns and each step's reward is that turn's reward.

A task row holds an ``id`` and the env's constructor arguments (``calculator``: ``problem_id``,
``problem``, ``answer``), or a ``task`` string for aviary's ``from_task``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

from agentloop.envs.base import Env, StepResult
from agentloop.envs.foreign import task_to_play
from agentloop.envs.task_files import TaskFiles, TaskSchema
from agentloop.errors import EnvError, did_you_mean
from agentloop.types import Message, Role, Task

__all__ = ["AVIARY_SCHEMA", "AviaryEnv", "aviary_env"]

#: Any row with an ``id``: its other fields are the env's constructor arguments.
AVIARY_SCHEMA = TaskSchema("aviary task", required={}, optional={"task": (str,)})
_ROLES: tuple[Role, ...] = ("system", "user", "assistant", "tool")


def aviary_env(name: str, *, files: Mapping[str, str] | None = None) -> AviaryEnv:
    """The adapter's entry point (``agentloop.envs.make("aviary:<name>", files=...)``)."""
    return AviaryEnv(name, files=files)


class AviaryEnv(Env):
    """aviary's env ``name`` (``Environment.available()``: ``dummy``, ``calculator`` with
    ``aviary-gsm8k``, ...), made per episode from the task's row; ``files`` are the task files
    per split (JSONL, JSON or parquet)."""

    def __init__(self, name: str, *, files: Mapping[str, str] | None = None) -> None:
        from aviary.core import Environment

        known = Environment.available()
        if name not in known:
            raise EnvError(
                f"aviary has no env {name!r}.{did_you_mean(name, known)} Its envs: "
                f"{sorted(known)} (calculator comes with pip install aviary-gsm8k, hotpotqa "
                "with aviary-hotpotqa)"
            )
        self.name = name
        self.files = None if files is None else TaskFiles(files, AVIARY_SCHEMA, self._id)
        self._env: Any = None
        self._turn = 0

    @property
    def _id(self) -> str:
        return f"aviary:{self.name}"

    def tasks(self, split: str = "train", limit: int | None = None) -> Sequence[Task]:
        if self.files is None:
            raise EnvError(
                f"{self._id} reads its tasks from files: pass files={{'test': 'tasks.jsonl'}} "
                "(eval --env-arg files=..., data.train_files), rows holding an id and the env's "
                "constructor arguments"
            )
        return self.files.tasks(split, limit)

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools of the first task's env after its reset (aviary makes tools in reset)."""
        if self.files is None:
            return []
        first = next(iter(self.files.files))
        schemas: list[dict[str, Any]] = json.loads(
            _probe_tools(self.name, json.dumps(_kwargs(self.tasks(first, 1)[0])))
        )
        return schemas

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        await self.close()
        task = task_to_play(self, seed, options)
        self._env = _make(self.name, _kwargs(task), task.id)
        observations, tools = await self._env.reset()
        shown = sorted(t["function"]["name"] for t in self.tool_schemas)
        if sorted(t.info.name for t in tools) != shown:
            raise EnvError(
                f"{self._id}: task {task.id!r} has the tools {sorted(t.info.name for t in tools)}"
                f", but the model is shown {shown} (the first task's); one run plays one tool set"
            )
        self._turn = 0
        return _messages(observations, self._id), {"task_id": task.id}

    async def step(self, action: Message) -> StepResult:
        if self._env is None:
            raise EnvError("step() called before reset(); call reset() first")
        self._turn += 1
        observations, reward, done, truncated = await self._env.step(self._request(action))
        ended = bool(done or truncated)
        return StepResult(
            [] if ended else _messages(observations, self._id),
            float(reward),
            bool(done),
            bool(truncated) and not done,
        )

    def _request(self, action: Message) -> Any:
        """aviary's message for ``action``: its parsed calls as a ``ToolRequestMessage``."""
        from aviary.core import Message as AviaryMessage
        from aviary.core import ToolCall, ToolCallFunction, ToolRequestMessage

        calls = [c for c in action.tool_calls if c.parse_error is None]
        if not calls:
            return AviaryMessage(role="assistant", content=action.content)
        return ToolRequestMessage(
            content=action.content,
            tool_calls=[
                ToolCall(
                    id=c.id or f"call_{self._turn}_{i}",
                    function=ToolCallFunction(name=c.name, arguments=dict(c.arguments)),
                )
                for i, c in enumerate(calls)
            ],
        )

    async def close(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            await env.close()


def _kwargs(task: Task) -> dict[str, Any]:
    return dict(task.data)


def _make(name: str, kwargs: Mapping[str, Any], task_id: str) -> Any:
    from aviary.core import Environment

    try:
        if set(kwargs) == {"task"}:
            return Environment.from_name(name, task=kwargs["task"])
        return Environment.from_name(name, **kwargs)
    except (TypeError, ValueError) as exc:
        raise EnvError(
            f"aviary:{name} refused task {task_id!r} ({type(exc).__name__}: {exc}); a row holds "
            "the env's constructor arguments (or a 'task' string)"
        ) from None


@functools.cache
def _probe_tools(name: str, kwargs_json: str) -> str:
    """The OpenAI schemas (JSON) of the tools aviary's env gives at reset, once per process;
    played on a private loop in a thread, as the caller may be on an event loop."""

    async def probe() -> str:
        env = _make(name, json.loads(kwargs_json), "(tool probe)")
        try:
            _, tools = await env.reset()
            return json.dumps([t.model_dump(by_alias=True, mode="json") for t in tools])
        finally:
            await env.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, probe()).result(timeout=60)


def _messages(chat: Any, env_id: str) -> list[Message]:
    """aviary's messages as agentloop's (tool responses keep their call id and tool name)."""
    out = []
    for m in chat or []:
        role = getattr(m, "role", None)
        if role not in _ROLES:
            raise EnvError(f"{env_id} returned the message {m!r:.120} with role {role!r}")
        out.append(
            Message(
                cast(Role, role),
                str(m.content or ""),
                tool_call_id=getattr(m, "tool_call_id", None),
                name=getattr(m, "name", None),
            )
        )
    return out
