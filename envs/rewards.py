"""Rule-based rewards: boxed-answer extraction and a numeric math verifier."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from agentloop.types import Message, Task

__all__ = ["Reward", "RewardFn", "extract_boxed", "last_assistant_text", "math_equal"]


@dataclass(frozen=True, slots=True)
class Reward:
    """A score plus named metrics (format, tool use, …) logged next to it."""

    value: float
    metrics: Mapping[str, float] = field(default_factory=dict)


RewardFn = Callable[[Task, Sequence[Message]], "float | Reward | Awaitable[float | Reward]"]


def extract_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` in ``text`` (braces may nest), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def _to_number(text: str) -> Fraction | None:
    s = text.strip().strip("$").replace(",", "").replace(" ", "").rstrip(".")
    s = s.removeprefix("\\text{").removesuffix("}") if s.startswith("\\text{") else s
    frac = re.fullmatch(r"\\d?frac\{([^{}]+)\}\{([^{}]+)\}", s)
    if frac:
        num, den = _to_number(frac.group(1)), _to_number(frac.group(2))
        return num / den if num is not None and den not in (None, 0) else None
    if "/" in s:
        num_s, _, den_s = s.partition("/")
        num, den = _to_number(num_s), _to_number(den_s)
        return num / den if num is not None and den not in (None, 0) else None
    return Fraction(s) if _NUMBER.match(s) else None


def math_equal(predicted: str | None, gold: str | int | float) -> bool:
    """True when ``predicted`` denotes the same number as ``gold`` (``1,234``, ``1234.0``,
    ``\\frac{1}{2}`` and ``0.5`` all count), else an exact match after whitespace cleanup."""
    if predicted is None:
        return False
    p, g = _to_number(predicted), _to_number(str(gold))
    if p is not None and g is not None:
        return p == g
    return " ".join(predicted.split()) == " ".join(str(gold).split())


def last_assistant_text(messages: Sequence[Message]) -> str:
    """The text of the last assistant message, or ``""``."""
    return next((m.content for m in reversed(messages) if m.role == "assistant"), "")
