"""Convert Search-R1's QA parquet files (when you have them) into agentloop task files.

    python recipes/search_r1/prepare_data.py --out data/search_r1 \
        --train nq_hotpotqa_train/train.parquet --test nq_hotpotqa_train/test.parquet

Search-R1 publishes NQ + HotpotQA for training and the seven evaluation sets (NQ, TriviaQA,
PopQA, HotpotQA, 2WikiMultihopQA, Musique, Bamboogle) in one test file, each row with
``question``, ``golden_answers`` and ``data_source`` (older files keep the question only in the
``prompt`` messages and the answers in ``reward_model.ground_truth.target``; both work).

Writes ``train.jsonl``, ``test.jsonl`` (all seven sets, shuffled with a fixed seed, for
validation during training) and ``test_<source>.jsonl`` per source (for the final evaluation,
one ``agentloop eval`` per set). Rows are {id, prompt, answer: [gold answers], source}. Rows that
cannot be converted are named and stop the script unless --skip-bad.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from agentloop.envs.search_r1 import QA_SCHEMA
from agentloop.envs.task_files import BadRow, convert_rows, read_rows, write_tasks
from agentloop.errors import AgentLoopError

_QUESTION_IN_PROMPT = re.compile(r"Question:\s*(.+?)\s*$", re.S)


def _question(row: dict[str, Any]) -> str:
    question = row.get("question")
    if isinstance(question, str) and question.strip():
        return question.strip()
    prompt = row.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        found = _QUESTION_IN_PROMPT.search(str(prompt[-1].get("content", "")))
        if found:
            return found.group(1).strip()
    raise BadRow("no 'question' column and no 'Question: ...' in the prompt messages")


def _answers(row: dict[str, Any]) -> list[str]:
    golds = row.get("golden_answers")
    if golds is None:
        truth = (row.get("reward_model") or {}).get("ground_truth")
        golds = truth.get("target") if isinstance(truth, dict) else truth
    if isinstance(golds, str):
        golds = [golds]
    if not isinstance(golds, list | tuple):
        raise BadRow(f"gold answers are {type(golds).__name__}; expected a list of strings")
    out = [str(g).strip() for g in golds if str(g).strip()]
    if not out:
        raise BadRow("no gold answer ('golden_answers' or reward_model.ground_truth.target)")
    return out


def qa_row(row: Any, index: int, split: str) -> dict[str, Any]:
    """One Search-R1 row → ``{id, prompt, answer, source}``."""
    if not isinstance(row, dict):
        raise BadRow(f"row is a {type(row).__name__}, not an object")
    source = str(row.get("data_source") or "unknown")
    ident = row.get("id") or index
    return {"id": f"{source}-{split}-{ident}", "prompt": _question(row),
            "answer": _answers(row), "source": source}  # fmt: skip


def _convert(path: str, split: str, skip: bool) -> list[dict[str, Any]]:
    indexed = [(w, (i, r)) for i, (w, r) in enumerate(read_rows(path))]
    rows, bad = convert_rows(indexed, lambda ir: qa_row(ir[1], ir[0], split), skip_bad=skip)
    if bad:
        print(f"{path}: {len(bad)} bad rows left out", file=sys.stderr)
    seen: set[str] = set()
    for row in rows:  # some sources reuse ids; make them unique, deterministically
        base, k = row["id"], 1
        while row["id"] in seen:
            row["id"], k = f"{base}-{k}", k + 1
        seen.add(row["id"])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (e.g. data/search_r1)")
    ap.add_argument("--train", help="Search-R1 train parquet/jsonl (NQ + HotpotQA)")
    ap.add_argument("--test", help="Search-R1 test parquet/jsonl (the seven QA sets)")
    ap.add_argument("--seed", type=int, default=0, help="shuffle seed of test.jsonl")
    ap.add_argument("--skip-bad", action="store_true", help="leave unconvertible rows out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    try:
        if args.train:
            rows = _convert(args.train, "train", args.skip_bad)
            write_tasks(rows, out / "train.jsonl", QA_SCHEMA)
            print(f"train.jsonl: {len(rows)} questions")
        if args.test:
            rows = _convert(args.test, "test", args.skip_bad)
            by_source: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for row in rows:
                by_source[row["source"]].append(row)
            for source, part in sorted(by_source.items()):
                write_tasks(part, out / f"test_{source}.jsonl", QA_SCHEMA)
                print(f"test_{source}.jsonl: {len(part)} questions")
            random.Random(args.seed).shuffle(rows)
            write_tasks(rows, out / "test.jsonl", QA_SCHEMA)
    except AgentLoopError as exc:
        print(f"prepare_data: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
