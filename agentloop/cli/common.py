"""What several commands share: ``KEY=VALUE`` flags and named models."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["key_values", "named_model"]


def named_model(path: str) -> str:
    """``--model``: a model built here by name (tiny, tiny-calc, tiny-vlm) as its directory."""
    from agentloop.models import MODEL_NAMES, resolve_model_path

    return str(resolve_model_path(path)) if path in MODEL_NAMES else path


def key_values(items: Sequence[str]) -> dict[str, object]:
    """``KEY=VALUE`` pairs; values are JSON when they parse (numbers, true, null), else strings."""
    import json

    from agentloop.errors import ConfigError

    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{item!r} is not KEY=VALUE (e.g. enforce_eager=true)")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out
