"""Agent programs written with the official ``openai`` SDK, for the proxy's tests and docs.

``calc_agent`` is what a user writes: a multi-turn loop that asks the model, runs the tool
calls itself (a small arithmetic-only evaluator stands in for Python) and returns the final
text. ``rewriting_calc_agent`` does the same but rewrites its history after each tool call (it
replaces the call and its result by a user note), so its episodes have several segments.
``editing_calc_agent`` keeps every reply and tool result but edits its first user message after
each tool call: the model's earlier replies come back as context of a new segment.
Play them with ``agentloop eval --env agentloop/Agent-v0 --env-arg
agent=agentloop.testing.calc_agent:calc_agent``.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from typing import Any

from agentloop.envs.calc import SYSTEM_PROMPT, TOOL_NAME
from agentloop.types import Task

__all__ = [
    "CALC_TOOLS",
    "MAX_TURNS",
    "calc_agent",
    "editing_calc_agent",
    "rewriting_calc_agent",
    "run_python",
]

MAX_TURNS = 4
#: Calc-v0's tool, as an agent declares it to the API.
CALC_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "Run Python code in a persistent interpreter and see what it prints."
            "\n\nVariables, imports and files persist between calls in this conversation. Use "
            "print()\nto show results. There is no network access.",
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "The Python code to run."}
                },
                "required": ["code"],
            },
        },
    }
]
_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
}
_PRINT = re.compile(r"print\((.*)\)\s*$", re.S)


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return int(_OPS[type(node.op)](_eval(node.left), _eval(node.right)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return int(_OPS[type(node.op)](_eval(node.operand)))
    raise ValueError(f"unsupported expression: {ast.dump(node)[:60]}")


def run_python(code: str) -> str:
    """What ``print(<integer arithmetic>)`` prints; an error text for anything else."""
    match = _PRINT.search(code.strip())
    try:
        if match is None:
            raise ValueError("only print(<arithmetic>) is supported")
        return f"{_eval(ast.parse(match.group(1), mode='eval').body)}\n"
    except (ValueError, SyntaxError, ZeroDivisionError, RecursionError) as exc:
        return f"Error: {exc}"


def _tool_output(call: Any) -> str:
    try:
        code = json.loads(call.function.arguments).get("code", "")
    except (ValueError, AttributeError):
        return "Error: arguments are not a JSON object"
    return run_python(str(code))


async def calc_agent(task: Task, client: Any) -> str:
    """Ask, run the tool calls, send their results back; the first reply without calls is the
    answer. ``client`` is an ``openai.AsyncOpenAI``."""
    return await _tool_loop(task, client, edit_prompt=False)


async def _tool_loop(task: Task, client: Any, *, edit_prompt: bool) -> str:
    """:func:`calc_agent`'s loop; ``edit_prompt``: after each round of tool calls, rewrite the
    first user message (a note on the attempt)."""
    prompt = str(task.data["prompt"])
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": prompt},
    ]
    for attempt in range(MAX_TURNS):
        response = await client.chat.completions.create(
            model="agentloop", messages=messages, tools=CALC_TOOLS
        )
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return str(message.content or "")
        for call in message.tool_calls:
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": _tool_output(call)}
            )
        if edit_prompt:
            messages[1] = {"role": "user", "content": f"{prompt} (attempt {attempt + 2})"}
    return ""


async def rewriting_calc_agent(task: Task, client: Any) -> str:
    """Like :func:`calc_agent`, but each tool call and its result are replaced in the history
    by a user note with the result: every later request rewrites history (a new segment)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": str(task.data["prompt"])},
    ]
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(
            model="agentloop", messages=messages, tools=CALC_TOOLS
        )
        message = response.choices[0].message
        if not message.tool_calls:
            return str(message.content or "")
        outputs = [_tool_output(call) for call in message.tool_calls]
        messages.append({"role": "user", "content": "The tool printed: " + " ".join(outputs)})
    return ""


async def editing_calc_agent(task: Task, client: Any) -> str:
    """Like :func:`calc_agent`, keeping its replies and the tool results, but after each tool
    call it edits the first user message (a note on the attempt): every later request rewrites
    an earlier message, so it starts a new segment in which the earlier replies are context."""
    return await _tool_loop(task, client, edit_prompt=True)
