"""Env ids of other frameworks (``skyrl_gym:<id>``, ``aviary:<name>``, ...) and their adapters."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentloop.envs.base import Env
from agentloop.errors import EnvError, did_you_mean

__all__ = ["SCHEMES", "ForeignScheme", "make_foreign", "scheme_of"]


@dataclass(frozen=True)
class ForeignScheme:
    """One framework's env ids, ``<scheme>:<name>``: ``adapter`` (``"module:function"``) makes
    the agentloop env of ``name`` from that framework's package ``package`` (its import name),
    which the PyPI distribution ``dist`` installs (``pip install 'agentloop[envs]'``)."""

    scheme: str
    package: str
    dist: str
    adapter: str
    example: str

    def load(self) -> Callable[..., Env]:
        try:
            importlib.import_module(self.package)
        except ImportError as exc:
            raise EnvError(
                f"env ids '{self.scheme}:...' play {self.dist}'s envs, but {self.package!r} does "
                f"not import ({exc}); install it: pip install 'agentloop[envs]' (or pip install "
                f"{self.dist})"
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
