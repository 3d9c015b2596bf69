"""Your own reward for any tool env: ``FILE.py:fn`` or ``module:fn``, verl's signature or ours.

Two signatures are accepted, told apart by the function's parameter names:

- verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``, called with
  keywords as verl calls it: ``solution_str`` is the final reply's text, ``ground_truth`` the
  task's ``answer`` (a verl row's ``reward_model.ground_truth``), ``data_source`` and
  ``extra_info`` the task's fields of those names (None when absent). It may return a number or
  a mapping with a ``score`` (its other numeric entries become metrics), as verl allows.
- agentloop's ``fn(task, messages) -> float | Reward``.

Either may be ``async``. A reward that raises becomes that episode's named reward error.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentloop.envs.rewards import Reward, RewardFn, last_assistant_text
from agentloop.errors import ConfigError, RewardError
from agentloop.types import Message, Task

__all__ = ["VERL_PARAMS", "load_reward"]

#: The parameters that mark a verl-style ``compute_score``.
VERL_PARAMS = ("data_source", "solution_str", "ground_truth")


def load_reward(spec: str) -> RewardFn:
    """The reward function ``spec`` names (``FILE.py:NAME`` or ``MODULE:NAME``) as agentloop's
    ``(task, messages)`` reward; a bad spec is a :class:`ConfigError` naming it and the fix."""
    fn = _load(spec)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]  # a builtin: called as agentloop's
    if all(name in params for name in VERL_PARAMS):
        extra = "extra_info" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        return _verl_reward(fn, spec, extra)
    return fn


def _load(spec: str) -> Callable[..., Any]:
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ConfigError(
            f"reward {spec!r} must be 'path/to/file.py:function' or 'package.module:function'"
        )
    if where.endswith(".py"):
        module = _load_file(Path(where).expanduser(), spec)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise ConfigError(
                f"reward {spec!r}: cannot import module {where!r} ({exc}); put it on PYTHONPATH "
                "or name a .py file"
            ) from None
    fn: object = getattr(module, name, None)
    if not callable(fn):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ConfigError(f"reward {spec!r}: {where} has no function {name!r}; it has {found}")
    return fn


def _load_file(path: Path, spec: str) -> Any:
    if not path.is_file():
        raise ConfigError(f"reward {spec!r}: {str(path)!r} is not a file; fix the path")
    key = f"agentloop_reward_{abs(hash(str(path.resolve())))}"
    if key in sys.modules:
        return sys.modules[key]
    loader = importlib.util.spec_from_file_location(key, path)
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(f"reward {spec!r}: {path} fails to import: {exc!r}") from exc
    sys.modules[key] = module
    return module


def _verl_reward(fn: Callable[..., Any], spec: str, extra: bool) -> RewardFn:
    def reward(task: Task, messages: Sequence[Message]) -> Reward | Awaitable[Reward]:
        kwargs = {"extra_info": task.data.get("extra_info")} if extra else {}
        out = fn(
            data_source=task.data.get("data_source"),
            solution_str=last_assistant_text(messages),
            ground_truth=task.data.get("answer"),
            **kwargs,
        )
        if inspect.isawaitable(out):
            return _later(out, spec)
        return _as_reward(out, spec)

    return reward


async def _later(out: Awaitable[Any], spec: str) -> Reward:
    return _as_reward(await out, spec)


def _as_reward(out: Any, spec: str) -> Reward:
    if isinstance(out, Mapping):
        if not isinstance(out.get("score"), int | float):
            raise RewardError(f"reward {spec!r} returned a mapping without a numeric 'score'")
        metrics = {
            str(k): float(v)
            for k, v in out.items()
            if k != "score" and isinstance(v, int | float) and not isinstance(v, bool)
        }
        return Reward(float(out["score"]), metrics)
    if isinstance(out, int | float):
        return Reward(float(out))
    raise RewardError(
        f"reward {spec!r} returned {type(out).__name__}; return a number or {{'score': ...}}"
    )
