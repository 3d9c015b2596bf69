"""Synthetic Calc-v0 SFT traces: a scripted expert plays the real env, so tool outputs are real."""

from __future__ import annotations

import asyncio
import json
import operator
import os
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop.envs.calc import make_calc_task
from agentloop.envs.registry import make
from agentloop.errors import EnvError
from agentloop.types import Message, Task, ToolCall

__all__ = [
    "CALC_ENV_ID",
    "TraceConfig",
    "expert_expression",
    "make_calc_traces",
    "trace_row",
    "write_traces",
]

CALC_ENV_ID = "agentloop/Calc-v0"
_NUMBER = re.compile(r"\d+")
_WHAT_IS = re.compile(r"^What is (?P<expr>[\d\s()+\-*]+)\?$")
_OPS = {"+": operator.add, "-": operator.sub}


@dataclass(frozen=True)
class TraceConfig:
    """What :func:`make_calc_traces` writes.

    Every episode is question → one tool call printing the expression → the real tool output →
    ``\\boxed{output}``, played through the env. ``num_traces`` rows are single episodes exactly
    as a rollout sees them (the env's tool schemas in the system prompt). ``num_compact`` rows
    each chain ``questions_per_compact`` episodes into one conversation (the next question is the
    next user turn) and leave the tool schemas out of the system prompt: ~90 tokens per episode
    instead of ~350, so the skill the tiny model has to learn (copying numbers into code and the
    output into the box) forms in a few hundred CPU steps; the rollout-format rows carry it over
    to the real prompt. Tasks are ``start_index ...`` of ``split``, consecutive.

    ``typo_rate`` is the fraction of episodes whose code mistypes one digit of one number (the
    box still holds the tool's output, so they are wrong): imperfect copying that RL can unlearn.
    ``sandbox`` goes to the env (``"local"`` bubblewrap; ``"fake"`` runs the same code
    in-process, unisolated, for tests).
    """

    num_traces: int = 1000
    num_compact: int = 0
    questions_per_compact: int = 4
    split: str = "train"
    start_index: int = 0
    digits: int = 3
    typo_rate: float = 0.0
    seed: int = 0
    sandbox: str = "local"
    concurrency: int = 8

    def __post_init__(self) -> None:
        counts = (
            self.num_traces,
            self.num_compact,
            self.start_index,
            self.concurrency - 1,
            self.questions_per_compact - 1,
        )
        if min(counts) < 0 or self.num_traces + self.num_compact < 1:
            raise EnvError(
                "TraceConfig needs num_traces, num_compact, start_index >= 0 (one of the counts "
                f"> 0), concurrency and questions_per_compact >= 1; got {self}"
            )
        if not 0.0 <= self.typo_rate <= 1.0:
            raise EnvError(f"TraceConfig.typo_rate={self.typo_rate!r} must be in [0, 1]")

    @property
    def num_episodes(self) -> int:
        return self.num_traces + self.num_compact * self.questions_per_compact


def expert_expression(task: Task) -> str:
    """The Python expression that answers a Calc task, its numbers in question order.

    ``"What is ..."`` questions are copied as written; word problems are ``a * b + c``. The
    expression is checked against the task's answer, so a new question template fails here
    instead of producing wrong traces.
    """
    prompt = str(task.data["prompt"])
    match = _WHAT_IS.match(prompt)
    if match:
        expr = " ".join(match.group("expr").split())
    else:
        numbers = _NUMBER.findall(prompt)
        if len(numbers) != 3:
            raise EnvError(f"task {task.id!r}: cannot script an answer for {prompt!r}")
        expr = f"{numbers[0]} * {numbers[1]} + {numbers[2]}"
    if str(_evaluate(expr)) != str(task.data["answer"]):
        raise EnvError(
            f"task {task.id!r}: the scripted expression {expr!r} does not give the answer "
            f"{task.data['answer']!r}; update expert_expression for this question template"
        )
    return expr


def _evaluate(expr: str) -> int:
    """Integer ``+ - *`` arithmetic with parentheses (the Calc question grammar), no ``eval``.

    A small recursive-descent parser rather than ``ast``: CPython 3.11 keeps ``ast.parse``'s
    recursion bookkeeping per interpreter, so a parse racing one in another thread can fail with
    "AST constructor recursion depth mismatch"."""
    tokens: list[str] = re.findall(r"\d+|[-+*()]|\S", expr)
    pos = 0

    def take() -> str:
        nonlocal pos
        if pos == len(tokens):
            raise EnvError(f"{expr!r} ends early; it is outside the Calc question grammar")
        pos += 1
        return tokens[pos - 1]

    def atom() -> int:
        tok = take()
        if tok.isdigit():
            return int(tok)
        if tok == "(":
            value = sum_()
            if take() == ")":
                return value
        raise EnvError(f"{expr!r} is outside the Calc question grammar (at {tok!r})")

    def product() -> int:
        value = atom()
        while pos < len(tokens) and tokens[pos] == "*":
            take()
            value *= atom()
        return value

    def sum_() -> int:
        value = product()
        while pos < len(tokens) and tokens[pos] in "+-":
            value = _OPS[take()](value, product())
        return value

    value = sum_()
    if pos != len(tokens):
        raise EnvError(f"{expr!r} is outside the Calc question grammar (at {tokens[pos]!r})")
    return value


def _typo(expr: str, rng: random.Random) -> str:
    """``expr`` with one digit of one number changed (never to a leading zero)."""
    spans = [m.span() for m in _NUMBER.finditer(expr)]
    start, end = spans[rng.randrange(len(spans))]
    pos = rng.randrange(start, end)
    choices = [d for d in "0123456789" if d != expr[pos] and not (d == "0" and pos == start)]
    return expr[:pos] + rng.choice(choices) + expr[pos + 1 :]


def _tool_signature(schemas: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """``(tool name, code argument)`` of the env's code tool."""
    for schema in schemas:
        fn = schema.get("function", {})
        params = fn.get("parameters", {}).get("properties", {})
        if "code" in params:
            return str(fn["name"]), "code"
    raise EnvError(f"{CALC_ENV_ID} offers no tool with a 'code' argument: {schemas}")


async def _episode(
    task: Task, cfg: TraceConfig, typo: bool, rng: random.Random
) -> tuple[list[Message], list[dict[str, Any]], float]:
    """Play the scripted expert on ``task``: (messages, the tool schemas shown, reward)."""
    env: Any = make(CALC_ENV_ID, digits=cfg.digits, sandbox=cfg.sandbox)
    name, arg = _tool_signature(env.tool_schemas)
    expr = expert_expression(task)
    if typo:
        expr = _typo(expr, rng)
    try:
        messages, _ = await env.reset(options={"task": task})
        call = ToolCall(name=name, arguments={arg: f"print({expr})"}, id="call_0")
        messages.append(Message("assistant", "", (call,)))
        step = await env.step(messages[-1])
        output = step.observation[0].content.strip() if step.observation else ""
        if not re.fullmatch(r"-?\d+", output):
            raise EnvError(
                f"task {task.id!r}: the {name!r} tool printed {output!r} for {expr!r}, not a "
                f"number; check the sandbox ({cfg.sandbox!r}) with `agentloop doctor`"
            )
        messages += [*step.observation, Message("assistant", f"\\boxed{{{output}}}")]
        final = await env.step(messages[-1])
    finally:
        await env.close()
    return messages, env.tool_schemas, float(final.reward)


def trace_row(
    episodes: Sequence[tuple[list[Message], list[dict[str, Any]], float]],
    tasks: Sequence[Task],
    *,
    with_tools: bool,
) -> dict[str, Any]:
    """One SFT row of consecutive expert episodes (messages, tool schemas, reward) as one
    conversation: ``tools`` on a rollout-format row, the tasks' ids and answers, mean reward."""
    messages = list(episodes[0][0])
    for later, _, _ in episodes[1:]:  # the next question continues the conversation
        messages += [m for m in later if m.role != "system"]
    row: dict[str, Any] = {"messages": [_openai_dict(m) for m in messages]}
    if with_tools:
        row["tools"] = episodes[0][1]
    row.update(
        task_ids=[t.id for t in tasks],
        answers=[t.data["answer"] for t in tasks],
        reward=sum(e[2] for e in episodes) / len(episodes),
    )
    return row


def _openai_dict(m: Message) -> dict[str, Any]:
    out = m.to_dict()
    if m.role == "tool":
        out.setdefault("tool_call_id", m.tool_call_id or "call_0")
    return out


async def make_calc_traces(config: TraceConfig) -> list[dict[str, Any]]:
    """Play the scripted expert on ``config``'s tasks through the real Calc-v0 env and tool.

    Returns JSON-ready rows (rollout-format and compact ones shuffled together, seeded):
    ``messages`` (OpenAI style: the assistant tool call in ``tool_calls``), ``tools`` (on
    rollout-format rows: the schemas the prompt shows), ``task_ids``, ``answers`` and ``reward``
    (the mean over the row's episodes: 1.0 unless one carries a typo). Deterministic.
    """
    n = config.num_episodes
    rng = random.Random(f"calc-traces/{config.seed}")
    typos = set(rng.sample(range(n), round(config.typo_rate * n)))
    tasks = [
        make_calc_task(config.split, config.start_index + i, digits=config.digits) for i in range(n)
    ]
    slots = asyncio.Semaphore(config.concurrency)

    async def one(i: int) -> tuple[list[Message], list[dict[str, Any]], float]:
        async with slots:
            typo_rng = random.Random(f"calc-traces/{config.seed}/{i}")
            return await _episode(tasks[i], config, i in typos, typo_rng)

    episodes = list(await asyncio.gather(*(one(i) for i in range(n))))
    k, full = config.questions_per_compact, config.num_traces
    rows = [trace_row(episodes[i : i + 1], tasks[i : i + 1], with_tools=True) for i in range(full)]
    rows += [
        trace_row(episodes[i : i + k], tasks[i : i + k], with_tools=False)
        for i in range(full, n, k)
    ]
    rng.shuffle(rows)
    return rows


def write_traces(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write rows as JSONL (one conversation per line) to ``path``; return it."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return out
