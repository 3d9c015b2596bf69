"""Env registry: ``register(id, entry_point)`` / ``make(id)``, mirrored into gymnasium's."""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentloop.envs.base import Env
from agentloop.errors import EnvError, did_you_mean

__all__ = ["EnvSpec", "make", "register", "registered", "spec"]

_ID = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.]+-v\d+$")
_REGISTRY: dict[str, EnvSpec] = {}


@dataclass(frozen=True)
class EnvSpec:
    """How to build an env: ``entry_point`` is a callable or ``"module:attr"``; ``kwargs`` are
    defaults that :func:`make`'s keyword arguments override."""

    id: str
    entry_point: Callable[..., Env] | str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def load(self) -> Callable[..., Env]:
        if callable(self.entry_point):
            return self.entry_point
        module, _, attr = self.entry_point.partition(":")
        try:
            loaded: Callable[..., Env] = getattr(importlib.import_module(module), attr)
            return loaded
        except (ImportError, AttributeError) as exc:
            raise EnvError(
                f"env {self.id!r}: cannot load entry point {self.entry_point!r} ({exc}); "
                "use 'package.module:ClassName'"
            ) from exc


def register(
    id: str,
    entry_point: Callable[..., Env] | str,
    *,
    kwargs: Mapping[str, Any] | None = None,
    description: str = "",
    override: bool = False,
) -> EnvSpec:
    """Register an env under ``namespace/Name-vN``; also makes ``gymnasium.make(id)`` work."""
    if not _ID.match(id):
        raise EnvError(f"env id {id!r} must look like 'namespace/Name-v0'")
    if id in _REGISTRY and not override:
        raise EnvError(f"env {id!r} is already registered; pass override=True to replace it")
    env_spec = EnvSpec(id, entry_point, dict(kwargs or {}), description)
    _REGISTRY[id] = env_spec
    _register_gymnasium(id)
    return env_spec


def spec(id: str) -> EnvSpec:
    """The registered spec of ``id``; an unknown id gets a did-you-mean error. As in
    gymnasium, ``"module:namespace/Name-v0"`` first imports ``module`` (which registers the env),
    so a user's own env works wherever an id is given: ``agentloop eval --env``, ``data.env``."""
    if ":" in id:
        module, _, id = id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EnvError(
                f"env '{module}:{id}': cannot import module {module!r} ({exc}); it must be "
                "importable (on PYTHONPATH, or the current directory) and register the env"
            ) from exc
    try:
        return _REGISTRY[id]
    except KeyError:
        raise EnvError(
            f"no env registered as {id!r}.{did_you_mean(id, _REGISTRY)} "
            f"Registered: {sorted(_REGISTRY)}"
        ) from None


def make(id: str, **kwargs: Any) -> Env:
    """A new instance of env ``id``; keyword arguments override the registered defaults. An id
    of another framework, ``<scheme>:<name>`` without a ``/`` (``skyrl_gym:gsm8k_multi_turn``),
    is made by that framework's adapter (:mod:`agentloop.envs.foreign`)."""
    if ":" in id and "/" not in id.partition(":")[2]:
        from agentloop.envs.foreign import make_foreign

        return make_foreign(id, **kwargs)
    env_spec = spec(id)
    id = env_spec.id
    factory = env_spec.load()
    try:
        env = factory(**{**env_spec.kwargs, **kwargs})
    except TypeError as exc:
        valid = _valid(factory, kwargs)
        raise EnvError(f"env {id!r}: bad arguments {sorted(kwargs)}: {exc}{valid}") from exc
    env.env_id = id
    return env


def _valid(factory: Callable[..., Env], kwargs: Mapping[str, Any]) -> str:
    """The keyword arguments ``factory`` takes, with a did-you-mean for each unknown one."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: nothing to list
        return ""
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return ""  # it takes any keyword: the TypeError came from inside
    names = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    hints = "".join(did_you_mean(k, names) for k in kwargs if k not in names)
    return f".{hints} Valid arguments: {names}"


def registered() -> list[str]:
    """All registered env ids, sorted."""
    return sorted(_REGISTRY)


def _register_gymnasium(id: str) -> None:
    import gymnasium

    from agentloop.envs.gym_adapter import GymnasiumEnv

    if id in gymnasium.registry:
        del gymnasium.registry[id]
    gymnasium.register(id, entry_point=functools.partial(GymnasiumEnv.from_id, id))
