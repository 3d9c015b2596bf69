"""Sandbox settings from config: a backend name, server URLs, or a backend with its options."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentloop.errors import ConfigError
from agentloop.sandboxes.base import Sandbox, SandboxLimits, available_sandboxes, make_sandbox

__all__ = ["SandboxConfig", "SandboxSpec", "sandbox_spec"]


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """A backend name and its constructor options: what ``make_sandbox`` builds, hashable so
    that every episode of a run shares one sandbox (``shared_sandbox(spec)``)."""

    backend: str
    options: tuple[tuple[str, Any], ...] = ()

    def build(self) -> Sandbox:
        options = {k: _thaw(v) for k, v in self.options}
        if isinstance(options.get("limits"), Mapping):  # from YAML: {timeout_s: 10, ...}
            try:
                options["limits"] = SandboxLimits(**options["limits"])
            except TypeError as exc:
                raise ConfigError(f"sandbox limits {options['limits']!r}: {exc}") from None
        return make_sandbox(self.backend, **options)

    def __str__(self) -> str:
        if not self.options:
            return self.backend
        return f"{self.backend}({', '.join(f'{k}={v!r}' for k, v in self.options)})"


#: What an env's ``sandbox`` argument accepts from a config or the command line.
SandboxConfig = str | Mapping[str, Any] | SandboxSpec


def sandbox_spec(value: SandboxConfig) -> SandboxSpec:
    """Read a ``sandbox`` setting.

    - a backend name: ``"local"``, ``"remote"`` (its servers from ``$AGENTLOOP_SANDBOX_URLS``);
    - server URLs, comma-separated: ``"http://10.0.0.5:8080,http://10.0.0.6:8080"`` (the
      ``remote`` backend);
    - a mapping with ``backend`` and that backend's options, e.g. ``{"backend": "remote",
      "urls": [...], "token_env": "SANDBOX_TOKEN", "connect_timeout_s": 3}`` or ``{"backend":
      "local", "pool_size": 8, "limits": {"memory_mb": 2048}}``, or its JSON text (what
      ``--env-arg sandbox='{...}'`` passes).
    """
    if isinstance(value, SandboxSpec):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise ConfigError(f"sandbox setting {text!r} is not valid JSON: {exc}") from None
        elif text.startswith(("http://", "https://")):
            return SandboxSpec("remote", (("urls", tuple(u.strip() for u in text.split(","))),))
        else:
            return SandboxSpec(_backend(text))
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"sandbox must be a backend name, server URLs or a mapping with 'backend', "
            f"got {value!r}"
        )
    options = {str(k): v for k, v in value.items()}
    backend = options.pop("backend", None)
    if not isinstance(backend, str):
        raise ConfigError(
            f"sandbox settings {dict(value)!r} need 'backend', one of {available_sandboxes()} "
            "(e.g. {backend: remote, urls: [http://10.0.0.5:8080]})"
        )
    frozen = tuple(sorted((k, _freeze(v)) for k, v in options.items()))
    return SandboxSpec(_backend(backend), frozen)


def _backend(name: str) -> str:
    if name not in available_sandboxes():
        raise ConfigError(
            f"unknown sandbox backend {name!r}; use one of {available_sandboxes()}, server URLs "
            "(http://host:8080,...) or a mapping like {backend: remote, urls: [...]}"
        )
    return name


def _freeze(value: Any) -> Any:
    """Lists (YAML, JSON) as tuples and mappings as sorted pairs: a hashable spec."""
    if isinstance(value, Mapping):
        return ("__mapping__", tuple(sorted((str(k), _freeze(v)) for k, v in value.items())))
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "__mapping__":
        return {k: _thaw(v) for k, v in value[1]}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value
