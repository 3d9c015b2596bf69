"""`agentloop eval` on a MathTool-v0 task file: the issue's five equivalent answers score 1.0, and
each episode's verdict (answer read, check, why) reaches trajectories.jsonl and the viewer."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentloop import eval as eval_module
from agentloop.cli import main
from agentloop.engines.fake import FakeEngine
from agentloop.io import read_jsonl

#: (problem, gold, the scripted final reply): the issue's five false negatives.
FIVE = [
    ("Simplify the square root of 12.", "2\\sqrt{3}", "So it is \\boxed{\\sqrt{12}}"),
    ("What percent is 1 of 10?", "10", "That is \\boxed{10\\%}"),
    ("Solve x + 1 = 4.", "3", "We get \\boxed{x = 3}"),
    ("What is two to the tenth?", "1024", "It is \\boxed{2^{10}}"),
    ("What is 3 + 4?", "7", "The answer is 7."),
]
SMALL = ["--max-turns", "2", "--max-response-len", "64", "--max-prompt-len", "768"]


def _task_file(tmp_path: Path) -> Path:
    path = tmp_path / "math.jsonl"
    rows = [{"id": f"m{i}", "prompt": p, "answer": g} for i, (p, g, _) in enumerate(FIVE)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _scripted(monkeypatch: pytest.MonkeyPatch, tokenizer: Any) -> None:
    """`agentloop eval`'s engine replaced by one that gives each problem its fixed reply."""
    replies = {p: reply for p, _, reply in FIVE}

    def respond(prompt_ids: Any, sampling: Any) -> str:
        text = tokenizer.decode(prompt_ids)
        (problem,) = [p for p in replies if p in text]
        return replies[problem]

    @contextlib.asynccontextmanager
    async def scripted(config: Any) -> AsyncIterator[FakeEngine]:
        yield FakeEngine(respond, tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id)

    monkeypatch.setattr(eval_module, "open_engine", scripted)


@pytest.mark.parametrize("extraction", ["verifier", "boxed"])
def test_the_five_pairs_score_one_through_agentloop_eval(
    extraction: str,
    tiny_model_dir: Path,
    tokenizer: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _scripted(monkeypatch, tokenizer)
    out = tmp_path / "run"
    files = json.dumps({"test": str(_task_file(tmp_path))})
    args = ["eval", "--env", "agentloop/MathTool-v0", "--model", str(tiny_model_dir),
            "--out", str(out), "--engine", "hf", "--n", "1", "--quiet", "--env-arg",
            f"files={files}", "--env-arg", "sandbox=fake", "--env-arg",
            f"answer_extraction={extraction}", *SMALL]  # fmt: skip
    assert main(args) == 0
    records = {r["task_id"]: r for r in read_jsonl(out / "trajectories.jsonl")}
    rewards = {t: r["reward"] for t, r in records.items()}
    if extraction == "verifier":
        assert rewards == {f"m{i}": 1.0 for i in range(5)}, rewards
    else:  # boxed only: the unboxed "The answer is 7." has no answer
        assert rewards == {"m0": 1.0, "m1": 1.0, "m2": 1.0, "m3": 1.0, "m4": 0.0}, rewards
        assert records["m4"]["verdict"]["by"] == "no answer"
    sqrt = records["m0"]["verdict"]
    assert sqrt["answer"] == "\\sqrt{12}" and sqrt["gold"] == "2\\sqrt{3}" and sqrt["correct"]
    assert sqrt["by"] == "math-verify" and "=" in sqrt["detail"]
    assert all(r["metrics"]["grader_timeout"] == 0.0 for r in records.values())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["grader_timeouts"] == 0

    # The viewer carries each verdict and renders it.
    assert main(["view", str(out)]) == 0
    html = (out / "view.html").read_text()
    payload = re.search(r'<script type="application/json" id="agentloop-data">(.*?)</script>', html)
    assert payload is not None and "function renderVerdict" in html
    shown = {t["task_id"]: t["verdict"] for t in json.loads(payload.group(1))["trajectories"]}
    assert shown["m0"] == sqrt
    assert shown["m4"]["answer"] == ("7" if extraction == "verifier" else None)
