"""Recipe fixtures: small files in the public datasets' own formats, and the recipes' scripts."""

from __future__ import annotations

import importlib.util
import io
import json
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"

DAPO_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    '{problem}\n\nRemember to put your answer on its own line after "Answer:".'
)
#: (problem, answer, the python expression an oracle prints): answers the tool computes exactly.
MATH_PROBLEMS = [
    ("What is the remainder when 7^100 is divided by 13?", "9", "pow(7, 100, 13)"),
    ("How many positive divisors does 3600 have?", "45",
     "sum(1 for d in range(1, 3601) if 3600 % d == 0)"),
    ("Find the sum of the digits of 2^50.", "76", "sum(map(int, str(2**50)))"),
    ("Compute 123 * 457 - 89.", "56122", "123 * 457 - 89"),
    ("What is the number of primes below 100?", "25",
     "sum(all(n % p for p in range(2, n)) for n in range(2, 100))"),
    ("Find the last three digits of 3^2024.", "721", "pow(3, 2024, 1000)"),
]  # fmt: skip
QA = [
    ("who wrote the play hamlet", ["William Shakespeare", "Shakespeare"], "nq"),
    ("what is the capital of australia", ["Canberra"], "nq"),
    ("which river flows through vienna", ["Danube", "the Danube"], "hotpotqa"),
    ("in which year did the berlin wall fall", ["1989"], "triviaqa"),
    ("what element has the chemical symbol fe", ["Iron"], "popqa"),
    ("who painted the mona lisa", ["Leonardo da Vinci", "Leonardo"], "bamboogle"),
]
#: Passages a fake retriever serves: each question's answer is in one.
PASSAGES = [
    ("Hamlet", "Hamlet is a tragedy written by William Shakespeare around 1600."),
    ("Canberra", "Canberra is the capital city of Australia."),
    ("Vienna", "Vienna, the capital of Austria, lies on the Danube river."),
    ("Berlin Wall", "The Berlin Wall fell on 9 November 1989."),
    ("Iron", "Iron is a chemical element with the symbol Fe and atomic number 26."),
    ("Mona Lisa", "The Mona Lisa is a portrait painted by Leonardo da Vinci."),
]
#: (question, answer, colour of the square the answer is written in).
VQA = [
    ("What colour is the small square in the corner?", "red", (220, 30, 30)),
    ("What is the colour of the square at the bottom right?", "blue", (30, 60, 220)),
    ("Which option names the colour of the square? A. red B. green C. blue", "B", (30, 170, 60)),
    ("Name the colour of the tiny square near the corner.", "green", (30, 170, 60)),
]


def load_script(recipe: str, name: str = "prepare_data") -> ModuleType:
    """Import ``recipes/<recipe>/<name>.py`` (the recipes are scripts, not a package)."""
    path = RECIPES / recipe / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"recipe_{recipe}_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_jsonl(path: Path, rows: Sequence[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(list(rows)), path)
    return path


def dapo_rows() -> list[dict[str, Any]]:
    """DAPO-Math-17k's schema; the published file repeats each problem, so do we."""
    rows = []
    for i, (problem, answer, _) in enumerate(MATH_PROBLEMS * 2):
        rows.append({
            "data_source": "math_dapo", "ability": "MATH",
            "prompt": [{"role": "user", "content": DAPO_TEMPLATE.format(problem=problem)}],
            "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"uuid-{i % len(MATH_PROBLEMS)}"},
        })  # fmt: skip
    return rows


def aime_rows() -> list[dict[str, Any]]:
    """Maxwell-Jia/AIME_2024's schema (``Answer`` is an integer there)."""
    return [{"ID": f"2024-I-{i + 1}", "Problem": p, "Solution": "…", "Answer": int(a)}
            for i, (p, a, _) in enumerate(MATH_PROBLEMS)]  # fmt: skip


def retool_sft_rows() -> list[dict[str, Any]]:
    """JoeYing/ReTool-SFT's schema: one user turn, one assistant trace with tagged blocks."""
    rows = []
    for problem, answer, expr in MATH_PROBLEMS:
        trace = (f"Let me compute it.\n<code>\n```python\nprint({expr})\n```\n</code>\n"
                 f"<interpreter>\n{answer}\n</interpreter>\nSo the result is {answer}.\n"
                 f"<answer>\n\\boxed{{{answer}}}\n</answer>")  # fmt: skip
        question = f"Solve the problem with code.\n\n*user question:*\n{problem}\n\n<answer>"
        rows.append({"messages": [{"role": "user", "content": question},
                                  {"role": "assistant", "content": trace}]})  # fmt: skip
    return rows


def search_r1_rows(split: str) -> list[dict[str, Any]]:
    """Search-R1's nq_hotpotqa parquet schema."""
    return [{"id": f"{split}_{i}", "question": q, "golden_answers": golds, "data_source": src,
             "prompt": [{"role": "user", "content": f"Answer the given question. Question: {q}\n"}],
             "reward_model": {"ground_truth": {"target": golds}, "style": "rule"},
             "ability": "fact-reasoning", "extra_info": {"index": i, "split": split}}
            for i, (q, golds, src) in enumerate(QA)]  # fmt: skip


def _png(color: tuple[int, int, int]) -> bytes:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (640, 480), (240, 240, 235))
    ImageDraw.Draw(image).rectangle((600, 440, 630, 470), fill=color)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def deepeyes_rows() -> list[dict[str, Any]]:
    """DeepEyes-Datasets-47k's schema: chat prompt with an <image> placeholder, image bytes."""
    return [{"data_source": "vstar", "ability": "vqa",
             "prompt": [{"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": f"<image>\n{q}"}],
             "images": [{"bytes": _png(color), "path": None}],
             "reward_model": {"ground_truth": a, "style": "model"},
             "extra_info": {"question": q, "answer": a, "index": i}}
            for i, (q, a, color) in enumerate(VQA)]  # fmt: skip


@pytest.fixture(scope="session")
def retool_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``data/retool`` made by the recipe's prepare_data.py from public-format files."""
    src, out = tmp_path_factory.mktemp("retool-src"), tmp_path_factory.mktemp("retool") / "data"
    script = load_script("retool")
    code = script.main([
        "--out", str(out),
        "--retool-sft", str(write_jsonl(src / "retool_sft.jsonl", retool_sft_rows())),
        "--dapo", str(write_jsonl(src / "dapo.jsonl", dapo_rows())),
        "--aime2024", str(write_jsonl(src / "aime24.jsonl", aime_rows())),
        "--aime2025", str(write_jsonl(src / "aime25.jsonl", aime_rows())),
    ])  # fmt: skip
    assert code == 0
    return out


@pytest.fixture(scope="session")
def search_r1_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src, out = tmp_path_factory.mktemp("sr1-src"), tmp_path_factory.mktemp("sr1") / "data"
    code = load_script("search_r1").main([
        "--out", str(out),
        "--train", str(write_jsonl(src / "train.jsonl", search_r1_rows("train"))),
        "--test", str(write_jsonl(src / "test.jsonl", search_r1_rows("test"))),
    ])  # fmt: skip
    assert code == 0
    return out


@pytest.fixture(scope="session")
def deepeyes_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src, out = tmp_path_factory.mktemp("de-src"), tmp_path_factory.mktemp("de") / "data"
    parquet = write_parquet(src / "data_0.1.2_visual_toolbox_v2.parquet", deepeyes_rows())
    code = load_script("deepeyes").main(["--out", str(out), "--val-size", "1", str(parquet)])
    assert code == 0
    return out
