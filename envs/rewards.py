"""Rule-based rewards: boxed-answer extraction, a numeric math verifier, QA exact match and F1."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from agentloop.types import Message, Task, Verdict

__all__ = [
    "Reward",
    "RewardFn",
    "exact_match",
    "extract_boxed",
    "extract_final_answer",
    "f1_score",
    "last_assistant_text",
    "math_equal",
    "normalize_answer",
    "to_number",
]


@dataclass(frozen=True, slots=True)
class Reward:
    """A score plus named metrics (format, tool use, …) logged next to it, and the ``verdict``
    (the answer read and why it scored so) where the env grades an answer."""

    value: float
    metrics: Mapping[str, float] = field(default_factory=dict)
    verdict: Verdict | None = None


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


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def extract_final_answer(text: str) -> str | None:
    r"""The content of the last ``<answer>...</answer>`` in ``text`` (the Search-R1 and DeepEyes
    convention), else of the last ``oxed{...}``, stripped; None if neither is there."""
    found = _ANSWER_TAG.findall(text)
    return found[-1].strip() if found else extract_boxed(text)


_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d{1,3})?$")
#: Longer strings are not read as numbers here (``Fraction`` of a huge literal is slow, and
#: Python refuses int strings over 4,300 digits); the symbolic verifier gets them.
_MAX_NUMBER_CHARS = 100
_SPACED_DIGITS = re.compile(r"\d\s+\d")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?$")  # commas only as 1,234,567.5


def to_number(text: str) -> Fraction | None:
    """``text`` as an exact number (``1,234``, ``-3.5``, ``$7$``, ``\\frac{1}{2}``, ``3/4``,
    ``1e3``), or None when it is not a plain number (or is over 100 characters)."""
    if len(text) > _MAX_NUMBER_CHARS:
        return None
    s = text.strip().strip("$").rstrip(".")
    if _SPACED_DIGITS.search(s) or ("," in s and not _THOUSANDS.search(s)):
        return None  # "1 234", "1, 2, 3", "1,23": a list or a typo, not a number
    s = s.replace(",", "").replace(" ", "")
    s = s.removeprefix("\\text{").removesuffix("}") if s.startswith("\\text{") else s
    frac = re.fullmatch(r"\\d?frac\{([^{}]+)\}\{([^{}]+)\}", s)
    if frac:
        num, den = to_number(frac.group(1)), to_number(frac.group(2))
        return num / den if num is not None and den not in (None, 0) else None
    if "/" in s:
        num_s, _, den_s = s.partition("/")
        num, den = to_number(num_s), to_number(den_s)
        return num / den if num is not None and den not in (None, 0) else None
    return Fraction(s) if _NUMBER.match(s) else None


def math_equal(predicted: str | None, gold: str | int | float) -> bool:
    """True when ``predicted`` denotes the same number as ``gold`` (``1,234``, ``1234.0``,
    ``\\frac{1}{2}`` and ``0.5`` all count), else an exact match after whitespace cleanup."""
    if predicted is None:
        return False
    p, g = to_number(predicted), to_number(str(gold))
    if p is not None and g is not None:
        return p == g
    return " ".join(predicted.split()) == " ".join(str(gold).split())


def last_assistant_text(messages: Sequence[Message]) -> str:
    """The text of the last assistant message, or ``""``."""
    return next((m.content for m in reversed(messages) if m.role == "assistant"), "")


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalization: lower case, no punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def exact_match(predicted: str | None, golds: str | Sequence[str]) -> bool:
    """True when ``predicted`` equals one of ``golds`` after :func:`normalize_answer`."""
    if predicted is None:
        return False
    golds = [golds] if isinstance(golds, str) else golds
    return any(normalize_answer(predicted) == normalize_answer(g) for g in golds)


def f1_score(predicted: str | None, golds: str | Sequence[str]) -> float:
    """SQuAD token F1 of ``predicted`` against the best-matching gold answer."""
    if predicted is None:
        return 0.0
    pred = normalize_answer(predicted).split()
    best = 0.0
    for gold in [golds] if isinstance(golds, str) else golds:
        ref = normalize_answer(gold).split()
        common = sum((Counter(pred) & Counter(ref)).values())
        if common:
            p, r = common / len(pred), common / len(ref)
            best = max(best, 2 * p * r / (p + r))
        elif not pred and not ref:
            best = 1.0
    return best
