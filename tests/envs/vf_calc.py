"""A verifiers environment in verifiers' own format (``vf-init``'s layout): ``load_environment``
returns a ``vf.ToolEnv`` with a dataset, a ``python`` tool and a ``vf.Rubric``; verifiers' loader
finds it as ``vf-calc``. Its questions, system prompt and tool are Calc-v0's, which the tiny tool
caller was taught (the tool runs integer arithmetic only)."""

from __future__ import annotations

import ast
import operator
import re

import verifiers as vf
from datasets import Dataset

from agentloop.envs.calc import make_calc_task

SYSTEM_PROMPT = (
    "You are a careful calculator. Compute with the python tool and print() the result, then "
    "give the final answer as \\boxed{number}."
)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _arith(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    raise ValueError(f"not integer arithmetic: {ast.unparse(node)}")


def python(code: str) -> str:
    """Run Python code in a persistent interpreter and see what it prints.

    Variables, imports and files persist between calls in this conversation. Use print()
    to show results. There is no network access.

    Args:
        code: The Python code to run.
    """
    m = re.fullmatch(r"\s*print\((.*)\)\s*", code, re.S)
    if m is None:
        return "Error: only print(<integer arithmetic>) runs here"
    try:
        return f"{_arith(ast.parse(m.group(1), mode='eval').body)}\n"
    except (SyntaxError, ValueError) as exc:
        return f"Error: {exc}"


def correct_answer(completion, answer) -> float:
    """1.0 when the last reply's last \\boxed{} is the answer."""
    found = re.findall(r"\\boxed\{([^}]*)\}", completion[-1]["content"] or "")
    return float(bool(found) and found[-1].strip() == answer)


def reply_length(completion) -> float:
    """A score the tiny model's replies vary: the last reply's length mod 7, over 7."""
    return len(completion[-1]["content"] or "") % 7 / 7


def load_environment(num_examples: int = 8, max_turns: int = 3) -> vf.Environment:
    tasks = [make_calc_task("test", i) for i in range(num_examples)]
    rows = [{"question": t.data["prompt"], "answer": t.data["answer"]} for t in tasks]
    rubric = vf.Rubric(funcs=[correct_answer, reply_length], weights=[1.0, 0.5])
    return vf.ToolEnv(
        dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(rows[: max(1, num_examples // 2)]),
        system_prompt=SYSTEM_PROMPT,
        tools=[python],
        rubric=rubric,
        max_turns=max_turns,
    )
