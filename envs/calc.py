"""agentloop/Calc-v0: seeded arithmetic word problems, a sandboxed python tool, a boxed verifier.

The answers are integers and the skill is computing them, so the last ``\\boxed{}`` is graded
as a number only (``1,234`` and ``1234.0`` included), on the loop: a box holding an expression
(``12 \\cdot 3``) is wrong even where it equals the answer, or the policy could box the
question instead of computing it. The math envs grade equivalence with math-verify
(:mod:`agentloop.envs.math_grader`); Calc does not.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from fractions import Fraction

from agentloop.envs.base import AnswerHook
from agentloop.envs.math_grader import verdict_metrics
from agentloop.envs.rewards import Reward, extract_boxed, last_assistant_text, math_equal
from agentloop.envs.tool_env import ToolEnv
from agentloop.errors import EnvError
from agentloop.sandboxes import Sandbox, SandboxConfig
from agentloop.tools.code_interpreter import code_interpreter_tool
from agentloop.tools.tool import Tool
from agentloop.types import Message, Task, Verdict

__all__ = [
    "SYSTEM_PROMPT",
    "TOOL_NAME",
    "TOOL_TIMEOUT_S",
    "CalcEnv",
    "calc_reward",
    "calc_tool",
    "make_calc_task",
]

SYSTEM_PROMPT = (
    "You are a careful calculator. Compute with the python tool and print() the result, then "
    "give the final answer as \\boxed{number}."
)
#: The name the model calls; the tiny model's corpus, the demo and SFT traces use it.
TOOL_NAME = "python"
TOOL_TIMEOUT_S = 10.0
_SPLITS = ("train", "test")
_TEMPLATES: tuple[tuple[str, Callable[[int, int, int], int]], ...] = (
    ("What is {a} * {b} + {c}?", lambda a, b, c: a * b + c),
    ("What is {a} * {b} - {c}?", lambda a, b, c: a * b - c),
    ("What is ({a} + {c}) * {b}?", lambda a, b, c: (a + c) * b),
    (
        "A crate holds {a} apples. How many apples are in {b} crates and {c} loose apples?",
        lambda a, b, c: a * b + c,
    ),
    (
        "A train travels {a} km a day for {b} days, then {c} km more. How far does it go?",
        lambda a, b, c: a * b + c,
    ),
)


def make_calc_task(split: str, index: int, *, digits: int = 3) -> Task:
    """Task ``index`` of ``split``: the same (split, index, digits) always gives the same task."""
    if split not in _SPLITS:
        raise EnvError(f"Calc-v0 split {split!r} is unknown; use one of {_SPLITS}")
    if not 2 <= digits <= 6:
        raise EnvError(f"Calc-v0 digits must be in [2, 6], got {digits}")
    rng = random.Random(f"calc/{split}/{digits}/{index}")
    a = rng.randrange(10 ** (digits - 1), 10**digits)
    b = rng.randrange(10, 100)
    c = rng.randrange(1, 100)
    template, fn = _TEMPLATES[rng.randrange(len(_TEMPLATES))]
    return Task(
        id=f"calc-{split}-{index:06d}",
        data={"prompt": template.format(a=a, b=b, c=c), "answer": str(fn(a, b, c))},
    )


async def calc_reward(task: Task, messages: Sequence[Message]) -> Reward:
    """1.0 when the last ``\\boxed{}`` of the final answer is the task's answer as a number."""
    boxed = extract_boxed(last_assistant_text(messages))
    verdict = calc_verdict(boxed, str(task.data["answer"]))
    used_tool = any(m.tool_calls for m in messages if m.role == "assistant")
    metrics = {
        "correct": float(verdict.correct),
        "has_boxed": float(boxed is not None),
        "used_tool": float(used_tool),
        **verdict_metrics(verdict),
    }
    return Reward(float(verdict.correct), metrics, verdict)


def calc_verdict(boxed: str | None, gold: str) -> Verdict:
    """The numeric check alone (:func:`~agentloop.envs.rewards.math_equal`), as a Verdict."""
    if boxed is None:
        return Verdict(None, gold, False, "no answer", "no \\boxed{} answer in the final reply")
    if math_equal(boxed, gold):
        return Verdict(boxed, gold, True, "numeric", f"{boxed} = {gold} as numbers")
    return Verdict(boxed, gold, False, "numeric", f"{boxed} is not the number {gold}")


def calc_tool(
    sandbox: Sandbox | SandboxConfig = "local",
    *,
    max_concurrency: int | None = None,
    rate_limit_per_s: float | None = None,
) -> Tool:
    """Calc's ``python`` tool: the code interpreter in ``sandbox`` (an instance, or a setting
    whose per-event-loop shared sandbox is used), one session per episode."""
    return code_interpreter_tool(
        sandbox,
        timeout_s=TOOL_TIMEOUT_S,
        name=TOOL_NAME,
        max_concurrency=max_concurrency,
        rate_limit_per_s=rate_limit_per_s,
    )


class CalcEnv(ToolEnv):
    """Arithmetic that a small model cannot do in its head: multiply multi-digit numbers with the
    ``python`` tool and answer ``\\boxed{n}``. ``digits`` sets the size of the first operand.

    The tool is the code interpreter: the model's code runs in ``sandbox`` (default: the event
    loop's shared ``local`` bubblewrap sandbox), state persisting across the episode's calls.
    Pass ``sandbox="fake"`` for fast unit tests (unisolated, in-process ``exec``), or a sandbox
    you own (and close) to pick its backend and limits:
    ``make("agentloop/Calc-v0", sandbox=sb)``. From a config, ``sandbox`` may also be server URLs
    or ``{backend: remote, urls: [...], token_env: ...}``: a pool of ``agentloop serve-sandbox``
    servers. ``tool_max_concurrency`` / ``tool_rate_limit_per_s`` limit the ``python`` calls
    across every episode of the process. Grading: see the module docstring.
    """

    def __init__(
        self,
        *,
        digits: int = 3,
        max_turns: int | None = None,
        sandbox: Sandbox | SandboxConfig = "local",
        tool_max_concurrency: int | None = None,
        tool_rate_limit_per_s: float | None = None,
    ) -> None:
        tool = calc_tool(
            sandbox, max_concurrency=tool_max_concurrency, rate_limit_per_s=tool_rate_limit_per_s
        )
        super().__init__([tool], calc_reward, system_prompt=SYSTEM_PROMPT, max_turns=max_turns)
        self.digits = digits

    def tasks(self, split: str = "train", limit: int | None = None) -> list[Task]:
        n = limit if limit is not None else 10_000
        return [make_calc_task(split, i, digits=self.digits) for i in range(n)]

    def sample_task(self, seed: int | None) -> Task:
        return make_calc_task("train", seed or 0, digits=self.digits)

    def answer_hook(self) -> AnswerHook:
        """The boxed number; equal values vote together (``1,234`` = ``1234``)."""
        return _ANSWERS


def _number_key(text: str) -> str:
    try:
        return str(Fraction(text.replace(",", "").replace(" ", "")))
    except (ValueError, ZeroDivisionError):
        return " ".join(text.split())


_ANSWERS = AnswerHook(
    extract=lambda messages: extract_boxed(last_assistant_text(messages)),
    check=lambda answer, task: math_equal(answer, task.data["answer"]),
    normalize=_number_key,
)
