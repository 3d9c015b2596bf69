"""Convert the ReTool datasets (when you have them) into agentloop's task and SFT formats.

    python recipes/retool/prepare_data.py --out data/retool \
        --retool-sft ReTool-SFT/data/train-00000-of-00001.parquet \
        --dapo DAPO-Math-17k/data/dapo-math-17k.parquet \
        --aime2024 AIME_2024/aime_2024_problems.parquet --aime2025 aime_2025/train.jsonl

Writes (each only when its input is given):
  retool_sft.jsonl      cold-start SFT conversations: the ReTool-SFT traces as OpenAI messages
                        (``<code>`` → a code_interpreter tool call, ``<interpreter>`` → the tool
                        message, ``<answer>`` → the final reply), with the MathTool-v0 system
                        prompt and tool schema, so SFT sees exactly the RL prompt
  dapo_math_17k.jsonl   RL tasks {id, prompt, answer, source}: the problem without DAPO's
                        "Answer:" instructions (MathTool-v0 asks for \\boxed{}), deduplicated
  aime2024.jsonl, aime2025.jsonl   validation tasks

Every row is checked; rows that cannot be converted are named (file and row) and stop the
script, unless --skip-bad leaves them out. Inputs may be .parquet (needs pyarrow), .jsonl or .json.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from agentloop.envs.math_tool import MATH_SCHEMA, SYSTEM_PROMPT
from agentloop.envs.task_files import BadRow, convert_rows, read_rows, write_tasks
from agentloop.errors import AgentLoopError
from agentloop.tools import Toolset
from agentloop.tools.code_interpreter import code_interpreter_tool

_DAPO_HEAD = re.compile(r"^Solve the following math problem.*?where \$Answer is the answer to "
                        r"the problem\.\s*", re.S)  # fmt: skip
_DAPO_TAIL = re.compile(r'\s*Remember to put your answer on its own line after "Answer:"\.?\s*$')
_SEGMENT = re.compile(r"<code>(.*?)</code>\s*(?:<interpreter>(.*?)</interpreter>)?", re.S)
_FENCE = re.compile(r"```(?:python|py)?\s*\n?(.*?)```", re.S)
_QUESTION_MARK = "*user question:*"


def _text(row: Any, *names: str) -> str:
    """The first of ``names`` that ``row`` holds as a non-empty value, as a string."""
    if not isinstance(row, dict):
        raise BadRow(f"row is a {type(row).__name__}, not an object")
    for name in names:
        value = row.get(name)
        if value is not None and str(value).strip():
            return str(value).strip()
    raise BadRow(f"none of the columns {list(names)} holds a value (columns: {sorted(row)})")


def dapo_row(row: Any, seen: set[str]) -> dict[str, Any] | None:
    """A DAPO-Math-17k row (``prompt`` = chat messages, ``reward_model.ground_truth``) → task."""
    prompt = row.get("prompt") if isinstance(row, dict) else None
    if not isinstance(prompt, list) or not prompt or not isinstance(prompt[-1], dict):
        raise BadRow("'prompt' is not a list of chat messages")
    text = str(prompt[-1].get("content", ""))
    problem = _DAPO_TAIL.sub("", _DAPO_HEAD.sub("", text)).strip()
    truth = (row.get("reward_model") or {}).get("ground_truth")
    if not problem or truth is None or not str(truth).strip():
        raise BadRow("empty problem or missing reward_model.ground_truth")
    if problem in seen:  # the published file repeats every problem many times
        return None
    seen.add(problem)
    index = (row.get("extra_info") or {}).get("index", len(seen) - 1)
    return {"id": f"dapo-{index}", "prompt": problem, "answer": str(truth).strip(),
            "source": str(row.get("data_source") or "dapo-math-17k")}  # fmt: skip


def aime_row(row: Any, name: str, index: int) -> dict[str, Any]:
    """An AIME row (``Problem``/``problem``/``question`` and ``Answer``/``answer``) → task."""
    problem = _text(row, "Problem", "problem", "question", "prompt")
    answer = _text(row, "Answer", "answer")
    ident = row.get("ID") or row.get("id") or index
    return {"id": f"{name}-{ident}", "prompt": problem, "answer": answer, "source": name}


def retool_sft_row(row: Any, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """A ReTool-SFT row (``messages``: the question, then one assistant text with ``<code>``,
    ``<interpreter>`` and ``<answer>`` blocks) → an SFT conversation with real tool calls."""
    messages = row.get("messages") if isinstance(row, dict) else None
    if not isinstance(messages, list) or len(messages) < 2:
        raise BadRow("'messages' is not a list of (at least) a user and an assistant message")
    question = str(messages[0].get("content", ""))
    if _QUESTION_MARK in question:
        question = question.split(_QUESTION_MARK, 1)[1]
    question = question.replace("<answer>", "").replace("</answer>", "").strip()
    trace = str(messages[1].get("content", ""))
    out: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                 {"role": "user", "content": question}]  # fmt: skip
    pos = 0
    for n, match in enumerate(_SEGMENT.finditer(trace)):
        if match.group(2) is None:
            raise BadRow(f"<code> block {n} has no <interpreter> output after it")
        fenced = _FENCE.search(match.group(1))
        code = (fenced.group(1) if fenced else match.group(1)).strip()
        call = {"id": f"call_{n}", "type": "function",
                "function": {"name": "code_interpreter", "arguments": {"code": code}}}  # fmt: skip
        out.append({"role": "assistant", "content": trace[pos : match.start()].strip(),
                    "tool_calls": [call]})  # fmt: skip
        out.append({"role": "tool", "tool_call_id": f"call_{n}",
                    "content": match.group(2).strip()})  # fmt: skip
        pos = match.end()
    final = trace[pos:].replace("<answer>", "").replace("</answer>", "").strip()
    if not question or not final or "\\boxed{" not in final:
        raise BadRow("empty question, or the trace ends without a \\boxed{} answer")
    out.append({"role": "assistant", "content": final})
    return {"messages": out, "tools": tools}


def _write_sft(rows: list[dict[str, Any]], path: Path) -> None:
    """Check every conversation with the SFT loader's own row check, then write JSONL."""
    import json

    from agentloop.trainers.sft_data import parse_row

    for i, row in enumerate(rows):
        parse_row(row, f"converted row {i}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _convert(args: argparse.Namespace, out: Path) -> None:
    skip = args.skip_bad
    if args.retool_sft:
        tools = Toolset([code_interpreter_tool("local")]).schemas
        rows, bad = convert_rows(
            read_rows(args.retool_sft), lambda r: retool_sft_row(r, tools), skip_bad=skip
        )
        _write_sft(rows, out / "retool_sft.jsonl")
        print(f"retool_sft.jsonl: {len(rows)} conversations ({len(bad)} bad rows left out)")
    if args.dapo:
        seen: set[str] = set()
        rows, bad = convert_rows(read_rows(args.dapo), lambda r: dapo_row(r, seen), skip_bad=skip)
        write_tasks(rows, out / "dapo_math_17k.jsonl", MATH_SCHEMA)
        print(f"dapo_math_17k.jsonl: {len(rows)} unique problems ({len(bad)} bad left out)")
    for name in ("aime2024", "aime2025"):
        if getattr(args, name):
            indexed = [(w, (i, r)) for i, (w, r) in enumerate(read_rows(getattr(args, name)))]
            rows, _ = convert_rows(
                indexed, lambda ir, n=name: aime_row(ir[1], n, ir[0]), skip_bad=skip
            )
            write_tasks(rows, out / f"{name}.jsonl", MATH_SCHEMA)
            print(f"{name}.jsonl: {len(rows)} problems")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (e.g. data/retool)")
    ap.add_argument("--retool-sft", help="JoeYing/ReTool-SFT parquet/jsonl")
    ap.add_argument("--dapo", help="BytedTsinghua-SIA/DAPO-Math-17k parquet/jsonl")
    ap.add_argument("--aime2024", help="AIME 2024 problems (e.g. Maxwell-Jia/AIME_2024)")
    ap.add_argument("--aime2025", help="AIME 2025 problems (e.g. yentinglin/aime_2025)")
    ap.add_argument("--skip-bad", action="store_true", help="leave unconvertible rows out")
    args = ap.parse_args(argv)
    try:
        _convert(args, Path(args.out))
    except AgentLoopError as exc:
        print(f"prepare_data: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
