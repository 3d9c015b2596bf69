"""The math grader: the numeric check first, math-verify in worker processes behind it, a deadline
that kills a runaway check while the event loop stays responsive."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from typing import Any

import pytest

from agentloop.envs import CalcEnv, calc_reward, grade_math, make
from agentloop.envs.math_grader import MathGrader, default_grader, fast_verdict
from agentloop.envs.math_tool import math_tool_reward
from agentloop.errors import EnvError
from agentloop.trainers.metrics import rollout_metrics
from agentloop.types import Message, StopReason, Task, Trajectory, TrajectoryGroup

#: The issue's five false negatives: (final reply, gold), each right.
FIVE = [
    ("\\boxed{\\sqrt{12}}", "2\\sqrt{3}"),
    ("\\boxed{10\\%}", "10"),
    ("\\boxed{x = 3}", "3"),
    ("\\boxed{2^{10}}", "1024"),
    ("The answer is 7.", "7"),
]
TOWER = "\\boxed{9^{9^{9^{9}}}}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().split(")")[-1].split()[0] != "Z"


async def test_the_five_pairs_score_one_with_the_verifiers_extraction() -> None:
    for reply, gold in FIVE:
        task = Task("t", {"prompt": "p", "answer": gold})
        r = await math_tool_reward(task, [Message("assistant", reply)], extraction="verifier")
        assert r.value == 1.0, (reply, gold, r.verdict)
        assert r.verdict is not None and r.verdict.by == "math-verify"
        assert r.metrics["grader_timeout"] == 0.0
    # Boxed-only extraction: the four boxed ones are right, the unboxed one has no answer.
    boxed = [await grade_math(reply[7:-1], gold) for reply, gold in FIVE[:4]]
    assert all(v.correct for v in boxed), boxed
    none = await grade_math(None, "7", reply="The answer is 7.")
    assert not none.correct and none.by == "no answer"


async def test_calc_integers_never_reach_the_verifier(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_verifier(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the verifier was asked: {args}")

    monkeypatch.setattr(MathGrader, "check", no_verifier)
    for i, task in enumerate(CalcEnv(digits=4, sandbox="fake").tasks("test", 100)):
        gold = int(task.data["answer"])
        right = [f"{gold:,}", f"{gold}.0", f"${gold}$", str(gold)][i % 4]
        wrong = str(gold + 1 + i % 7)
        for text, value in ((right, 1.0), (wrong, 0.0)):
            r = await calc_reward(task, [Message("assistant", f"so \\boxed{{{text}}}")])
            assert r.value == value and r.verdict is not None and r.verdict.by == "numeric"
    assert fast_verdict("12 \\cdot 3", "36") is None  # not a plain number: math-verify decides
    task = Task("t", {"prompt": "12 times 3?", "answer": "36"})
    boxed_question = await calc_reward(task, [Message("assistant", "\\boxed{12 \\cdot 3}")])
    assert boxed_question.value == 0.0  # Calc grades the number: no reward for boxing the question


async def test_a_power_tower_is_a_counted_timeout_and_the_loop_stays_responsive() -> None:
    """A tower whose comparison never ends is cut at its deadline (its worker killed) while a
    heartbeat measures the loop's lag and other episodes keep being graded."""
    grader, deadline = MathGrader(workers=2), 1.5
    await grader.check("\\boxed{1}", "\\boxed{1}", timeout_s=30)  # a worker up: start-up apart
    lags: list[float] = []
    done = asyncio.Event()

    async def heartbeat() -> None:
        while not done.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.02)
            lags.append(time.perf_counter() - t - 0.02)

    async def others() -> list[bool]:
        out = []
        for reply, gold in FIVE[:4] * 3:
            v = await grade_math(reply[7:-1], gold, timeout_s=30, grader=grader)
            out.append(v.correct)
        return out

    gc.collect()  # earlier tests' garbage is not this test's lag
    beat = asyncio.create_task(heartbeat())
    try:
        t0 = time.perf_counter()
        tower_task = asyncio.create_task(
            grade_math(TOWER[7:-1], "1", timeout_s=deadline, grader=grader)
        )
        await asyncio.sleep(0.3)  # the tower holds a worker
        pids = grader.live_pids()
        tower, other = await asyncio.gather(tower_task, others())
        elapsed = time.perf_counter() - t0
    finally:
        done.set()
        await beat
    try:
        assert tower.by == "timeout" and not tower.correct, tower
        assert elapsed < deadline + 10, elapsed  # ended at its deadline, not when sympy gave up
        assert all(other), other  # the other episodes were graded meanwhile
        assert grader.timeouts == 1
        assert lags and max(lags) < 0.2, f"event-loop lag {max(lags):.3f} s"
        assert any(not _alive(p) for p in pids)  # the spinning worker was killed, not leaked
        task = Task("t", {"prompt": "p", "answer": "1"})
        reward = await math_tool_reward(task, [Message("assistant", TOWER)], timeout_s=0.5)
        assert reward.value == 0.0 and reward.metrics["grader_timeout"] == 1.0
    finally:
        grader.shutdown()
    assert grader.live_pids() == [] and not any(_alive(p) for p in pids)


def test_grader_timeouts_reach_the_trainers_metrics() -> None:
    def traj(i: int, timeout: float) -> Trajectory:
        metrics = {"correct": 0.0, "grader_timeout": timeout}
        ids, mask, logprobs = (1, 2), (0, 1), (0.0, -1.0)
        return Trajectory("t", ids, mask, logprobs, 1, 0.0, StopReason.DONE, metrics=metrics,
                          sample_index=i)  # fmt: skip

    group = TrajectoryGroup(Task("t"), (traj(0, 1.0), traj(1, 0.0), traj(2, 1.0)))
    assert rollout_metrics([group])["reward/grader_timeouts"] == 2.0


async def test_the_default_grader_starts_lazily_and_shuts_down_clean() -> None:
    grader = default_grader()
    grader.shutdown()
    assert grader.live_pids() == []
    assert (await grade_math("\\frac{2}{4}", "0.5")).by == "numeric"  # no worker for this
    assert grader.live_pids() == []
    assert (await grade_math("\\sqrt{4}", "2")).correct
    pids = grader.live_pids()
    assert len(pids) == 1 and all(_alive(p) for p in pids)
    grader.shutdown()
    assert grader.live_pids() == [] and not any(_alive(p) for p in pids)


def test_the_extraction_setting_is_checked() -> None:
    with pytest.raises(EnvError, match=r"answer_extraction='box'.*'boxed'.*'verifier'"):
        make("agentloop/MathTool-v0", sandbox="fake", answer_extraction="box")
    with pytest.raises(EnvError, match="grader_timeout_s must be > 0"):
        make("agentloop/MathTool-v0", sandbox="fake", grader_timeout_s=0)


async def test_deepeyes_numeric_answers_go_to_math_verify_and_choices_stay_rules() -> None:
    from agentloop.envs.deepeyes import deepeyes_reward

    def task(gold: str) -> Task:
        return Task("t", {"prompt": "p", "answer": gold, "image": "x.png"})

    def reply(text: str) -> list[Message]:
        return [Message("assistant", f"<think>look</think><answer>{text}</answer>")]

    power = await deepeyes_reward(task("8"), reply("2^{3}"))
    assert power.metrics["correct"] == 1.0 and power.verdict is not None
    assert power.verdict.by == "math-verify"
    half = await deepeyes_reward(task("3.5"), reply("\\frac{7}{2}"))
    assert half.metrics["correct"] == 1.0 and half.verdict is not None
    assert half.verdict.by == "rule"  # the rules' number check: no worker needed
    choice = await deepeyes_reward(task("B"), reply("C"))
    assert choice.metrics["correct"] == 0.0 and choice.verdict is not None
    assert choice.verdict.by == "rule"
    unboxed = [Message("assistant", "<think>look</think>There are 3 cars.")]
    for extraction, right in (("boxed", 0.0), ("verifier", 1.0)):
        r = await deepeyes_reward(task("3"), unboxed, extraction=extraction)  # type: ignore[arg-type]
        assert r.metrics["correct"] == right and r.metrics["format_ok"] == 0.0
