"""Env ids of other frameworks (``skyrl_gym:<id>``, ``aviary:<name>``, ``verifiers:<env_id>``)
and their adapters."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentloop.envs.base import Env
from agentloop.errors import EnvError, did_you_mean
from agentloop.types import Task

__all__ = ["SCHEMES", "ForeignScheme", "make_foreign", "scheme_of", "task_to_play"]


@dataclass(frozen=True)
class ForeignScheme:
    """One framework's env ids, ``<scheme>:<name>``: ``adapter`` (``"module:function"``) makes
    the agentloop env of ``name`` from that framework's package ``package`` (its import name),
    which the PyPI distribution ``dist`` installs (``install``: how, by default ``pip install
    'agentloop[envs]'``)."""

    scheme: str
    package: str
    dist: str
    adapter: str
    example: str
    install: str | None = None

    def load(self) -> Callable[..., Env]:
        try:
            importlib.import_module(self.package)
        except ImportError as exc:
            install = self.install or f"pip install 'agentloop[envs]' (or pip install {self.dist})"
            raise EnvError(
                f"env ids '{self.scheme}:...' play {self.dist}'s envs, but {self.package!r} does "
                f"not import ({exc}); install it: {install}"
            ) from None
        module, _, attr = self.adapter.partition(":")
        factory: Callable[..., Env] = getattr(importlib.import_module(module), attr)
        return factory


#: scheme → how its ids are made; a new framework is one row here and one adapter module.
SCHEMES: dict[str, ForeignScheme] = {
    s.scheme: s
    for s in (
        ForeignScheme(
            "skyrl_gym",
            "skyrl_gym",
            "skyrl-gym",
            "agentloop.envs.skyrl_gym_env:skyrl_gym_env",
            "skyrl_gym:gsm8k_multi_turn",
        ),
        ForeignScheme(
            "aviary",
            "aviary.core",
            "fhaviary",
            "agentloop.envs.aviary_env:aviary_env",
            "aviary:calculator",
        ),
        ForeignScheme(
            "verifiers",
            "verifiers.legacy.envs.multiturn_env",
            "verifiers",
            "agentloop.envs.verifiers_env:verifiers_env",
            "verifiers:my-env",
            # 0.3.1 pins mcp<2 (agentloop's MCP tools use mcp 2): its other needs are in `envs`
            "pip install 'agentloop[envs]' && pip install --no-deps verifiers==0.3.1",
        ),
    )
}


def scheme_of(env_id: str) -> ForeignScheme | None:
    """The scheme of a foreign id (``skyrl_gym:gsm8k``), None for agentloop's own ids
    (``agentloop/Calc-v0``, ``my_module:me/Env-v0``)."""
    scheme, sep, name = env_id.partition(":")
    if not sep or "/" in name:
        return None
    return SCHEMES.get(scheme)


def make_foreign(env_id: str, **kwargs: Any) -> Env:
    """The agentloop env of a foreign id, through its scheme's adapter; ``kwargs`` go to it."""
    found = scheme_of(env_id)
    if found is None:
        scheme = env_id.partition(":")[0]
        raise EnvError(
            f"env {env_id!r}: no framework is named {scheme!r}.{did_you_mean(scheme, SCHEMES)} "
            f"Foreign ids are {', '.join(repr(s.example) for s in SCHEMES.values())}"
        )
    name = env_id.partition(":")[2]
    if not name:
        raise EnvError(f"env {env_id!r} names no env; give one, e.g. {found.example!r}")
    factory = found.load()
    signature = inspect.signature(factory)
    try:
        signature.bind(name, **kwargs)
    except TypeError as exc:
        params = [p for p in signature.parameters if p != "name"]
        hints = "".join(did_you_mean(k, params) for k in kwargs if k not in params)
        raise EnvError(
            f"env {env_id!r}: bad arguments {sorted(kwargs)}: {exc}.{hints} Valid arguments: "
            f"{params}"
        ) from None
    env = factory(name, **kwargs)
    env.env_id = env_id
    return env


def task_to_play(env: Env, seed: int | None, options: Mapping[str, Any] | None) -> Task:
    """The task an adapter's ``reset`` plays: ``options['task']``, else the ``seed``-th of the
    env's train tasks."""
    task = (options or {}).get("task")
    if task is None:
        tasks = env.tasks("train")
        task = tasks[(seed or 0) % len(tasks)]
    if not isinstance(task, Task):
        raise EnvError(f"options['task'] must be an agentloop Task, got {type(task).__name__}")
    return task
