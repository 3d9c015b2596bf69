"""skyrl-gym's text envs, unchanged, as agentloop envs: ``skyrl_gym:<id>`` (``skyrl-gym`` on PyPI).

SkyRL plays an env as ``env = skyrl_gym.make(env_class, env_config=..., extras=row)``, then
``env.init(prompt)`` and ``env.step(text)`` per model turn, each step returning
``{observations, reward, done, metadata}``. This adapter does the same from agentloop's loop: the
model's raw text goes to ``step``, the observations come back as masked user/tool turns, each
step's reward is that turn's reward (``Trajectory.turn_rewards``, what ``turn_rloo`` credits; the
other estimators see their sum), and ``get_metrics()`` joins the trajectory's metrics at the end.
The env's calls run in a worker thread: skyrl-gym's envs are synchronous (SQL, search, code).
"""

from __future__ import annotations

import asyncio
import copy
import importlib
from collections.abc import Mapping, Sequence
from typing import Any, cast

from agentloop.envs.base import Env, StepResult
from agentloop.envs.foreign import task_to_play
from agentloop.envs.task_files import TaskFiles, TaskSchema
from agentloop.errors import EnvError, did_you_mean
from agentloop.types import Message, Role, Task

__all__ = ["SKYRL_SCHEMA", "SkyRLGymEnv", "skyrl_gym_env"]

#: SkyRL's dataset rows (``examples/*/..._dataset.py``): chat prompt, the env class, and what
#: the env reads (``reward_spec``, ``extra_info``); an ``id`` comes from ``extra_info.index``.
SKYRL_SCHEMA = TaskSchema(
    "SkyRL",
    required={"prompt": (str, list)},
    optional={
        "env_class": (str,),
        "reward_spec": (dict,),
        "extra_info": (dict,),
        "data_source": (str,),
    },
)
_ROLES: tuple[Role, ...] = ("system", "user", "assistant", "tool")
_NOT_EXTRAS = ("prompt", "env_class", "answer")


def skyrl_gym_env(
    name: str,
    *,
    files: Mapping[str, str] | None = None,
    env_config: Mapping[str, Any] | None = None,
    max_turns: int | None = None,
) -> SkyRLGymEnv:
    """The adapter's entry point (``agentloop.envs.make("skyrl_gym:<name>", files=...)``).
    ``name`` is a skyrl-gym env id, or ``module:id`` for your own: ``module`` is imported first
    and registers ``id`` with ``skyrl_gym.register`` (as a SkyRL entrypoint does)."""
    module, sep, env_class = name.rpartition(":")
    if sep:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EnvError(
                f"env 'skyrl_gym:{name}': cannot import module {module!r} ({exc}); it must be "
                "importable (on PYTHONPATH, or the current directory) and skyrl_gym.register "
                f"{env_class!r}"
            ) from exc
    return SkyRLGymEnv(env_class, files=files, env_config=env_config, max_turns=max_turns)


class SkyRLGymEnv(Env):
    """skyrl-gym's env ``env_class``, made per episode from the task's row as SkyRL makes it.

    - ``files``: task files per split (SkyRL's parquet, JSONL; ``data.train_files``), rows in
      SkyRL's format; a row's ``env_class``, when given, must be ``env_class``.
    - ``env_config``: the env's ``environment.skyrl_gym.<env_class>`` section of a SkyRL config.
    - ``max_turns``: passed to the env as SkyRL's generator does (``extras["max_turns"]``).
    """

    def __init__(
        self,
        env_class: str,
        *,
        files: Mapping[str, str] | None = None,
        env_config: Mapping[str, Any] | None = None,
        max_turns: int | None = None,
    ) -> None:
        import skyrl_gym.envs  # noqa: F401  # registers skyrl-gym's own envs
        from skyrl_gym.envs.registration import registry

        if env_class not in registry:
            raise EnvError(
                f"skyrl-gym has no env {env_class!r}.{did_you_mean(env_class, registry)} Its "
                f"envs: {sorted(registry)} (a custom one: skyrl_gym.register it in a module "
                "imported first)"
            )
        self.env_class = env_class
        self.files = None if files is None else TaskFiles(files, SKYRL_SCHEMA, self._id)
        self.env_config = dict(env_config or {})
        self.max_turns = max_turns
        self._env: Any = None
        self._turn_count = 0

    @property
    def _id(self) -> str:
        return f"skyrl_gym:{self.env_class}"

    def tasks(self, split: str = "train", limit: int | None = None) -> Sequence[Task]:
        if self.files is None:
            raise EnvError(
                f"{self._id} reads its tasks from SkyRL-format files: pass files={{'train': "
                "'train.parquet', 'test': ...}} (eval --env-arg files=..., data.train_files)"
            )
        tasks = self.files.tasks(split, limit)
        for task in tasks:
            given = task.data.get("env_class")
            if given is not None and given != self.env_class:
                raise EnvError(
                    f"{self._id}: task {task.id!r} of split {split!r} has env_class {given!r}; "
                    f"play it with --env skyrl_gym:{given}, or drop env_class from the rows"
                )
        return tasks

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        await self.close()
        task = task_to_play(self, seed, options)
        self._env = await asyncio.to_thread(self._make, task)
        prompt = task.data["prompt"]
        chat = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        first, _meta = await asyncio.to_thread(self._env.init, copy.deepcopy(list(chat)))
        self._turn_count = 0
        return _messages(first, self._id), {"task_id": task.id}

    def _make(self, task: Task) -> Any:
        import skyrl_gym
        from omegaconf import OmegaConf

        extras = {k: copy.deepcopy(v) for k, v in task.data.items() if k not in _NOT_EXTRAS}
        extras.setdefault("extra_info", {})
        if self.max_turns is not None:
            extras["max_turns"] = self.max_turns
        config = OmegaConf.create(self.env_config)
        try:
            return skyrl_gym.make(self.env_class, env_config=config, extras=extras)
        except (AssertionError, KeyError, ValueError) as exc:
            raise EnvError(
                f"{self._id} refused task {task.id!r} ({type(exc).__name__}: {exc}); its rows "
                "need the fields the env reads (reward_spec.ground_truth, extra_info, ...)"
            ) from exc

    async def step(self, action: Message) -> StepResult:
        if self._env is None:
            raise EnvError("step() called before reset(); call reset() first")
        out = await asyncio.to_thread(self._env.step, action.content)
        self._turn_count += 1
        done = bool(out["done"])
        metrics: dict[str, float] = {}
        if done:
            found = await asyncio.to_thread(self._env.get_metrics)
            metrics = {f"skyrl/{k}": float(v) for k, v in found.items() if _is_number(v)}
        return StepResult(
            [] if done else _messages(out["observations"], self._id),
            float(out["reward"]),
            done,
            False,
            info={"skyrl_metadata": out.get("metadata") or {}},
            metrics=metrics,
        )

    async def close(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            await asyncio.to_thread(env.close)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _messages(chat: Any, env_id: str) -> list[Message]:
    """skyrl-gym's OpenAI-format messages as agentloop's; a bad one is an error naming it."""
    out = []
    for m in chat or []:
        if not isinstance(m, Mapping) or m.get("role") not in _ROLES:
            raise EnvError(
                f"{env_id} returned the message {m!r:.120}; skyrl-gym envs give "
                "{'role': 'user'/'tool'/..., 'content': str}"
            )
        out.append(Message(cast(Role, m["role"]), str(m.get("content") or "")))
    return out
