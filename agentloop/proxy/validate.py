"""Field checks every proxy route shares: each malformed value is a 400 naming the field."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentloop.proxy.errors import ProxyRequestError

__all__ = [
    "check_token_ids",
    "check_tools",
    "opt_bool",
    "opt_int",
    "opt_number",
    "opt_str",
]

#: OpenAI's rule for function names (what its API refuses, this proxy refuses too).
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def _bad(message: str, param: str) -> ProxyRequestError:
    return ProxyRequestError(message, param=param)


def opt_number(body: Mapping[str, Any], name: str, lo: float, hi: float) -> float | None:
    """``body[name]``: absent/None, or a finite JSON number in ``[lo, hi]`` (not a boolean)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(f"{name} must be a number, got {value!r:.40}", name)
    if not math.isfinite(value) or not lo <= value <= hi:
        raise _bad(f"{name} must be a finite number in [{lo}, {hi}], got {value!r}", name)
    return float(value)


def opt_int(body: Mapping[str, Any], name: str, lo: int, param: str | None = None) -> int | None:
    """``body[name]``: absent/None, or an integer ``>= lo`` (``true`` is not an integer)."""
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int or value < lo:
        raise _bad(f"{name} must be an integer >= {lo}, got {value!r:.40}", param or name)
    return value


def opt_bool(body: Mapping[str, Any], name: str) -> bool:
    """``body[name]``: absent/None (False), or a JSON boolean."""
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f"{name} must be true or false, got {value!r:.40}", name)
    return value


def opt_str(m: Mapping[str, Any], name: str, where: str) -> str | None:
    """``m[name]``: absent/None, or a string."""
    value = m.get(name)
    if value is not None and not isinstance(value, str):
        kind = type(value).__name__
        raise _bad(f"{where}.{name} must be a string, got {kind} {value!r:.40}", f"{where}.{name}")
    return value


def check_tools(tools: Any, param: str = "tools") -> tuple[Mapping[str, Any], ...]:
    """OpenAI function tools: ``[{type: function, function: {name, description?,
    parameters?}}]``; a name as OpenAI allows it, a string description, an object schema."""
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise _bad(f"'{param}' must be a list of {{type: function, function: {{...}}}}", param)
    for i, t in enumerate(tools):
        at = f"{param}[{i}]"
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or t.get("type", "function") != "function":
            raise _bad(f"{at} must be {{type: function, function: {{name, parameters}}}}", at)
        check_function(fn, f"{at}.function")
    return tuple(tools)


def check_function(fn: Mapping[str, Any], at: str) -> None:
    """One function schema: ``name`` (OpenAI's pattern), ``description`` a string,
    ``parameters`` an object."""
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _bad(
            f"{at}.name must be a string of 1-64 letters, digits, '_', '.' or '-', got "
            f"{name!r:.60}",
            f"{at}.name",
        )
    opt_str(fn, "description", at)
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise _bad(f"{at}.parameters must be a JSON Schema object, got {params!r:.40}", at)


def check_token_ids(ids: Sequence[int], vocab_size: int, param: str = "prompt") -> None:
    """Every id in ``[0, vocab_size)``: an id the model has no embedding for never reaches the
    engine (on a GPU it can be a device-side assert that poisons the process)."""
    bad = next((i for i, t in enumerate(ids) if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise _bad(
            f"{param}[{bad}] = {ids[bad]} is not a token id of this model's vocabulary "
            f"(0 .. {vocab_size - 1})",
            param,
        )
