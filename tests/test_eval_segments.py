"""Eval summaries of episodes written as several trajectories (segments): a proxied agent that
rewrote its history, ``--thinking strip``; and a resumed run's replayed episodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentloop.eval_report import EvalSummary, read_episodes, read_run, summarize
from agentloop.io import trajectory_to_dict
from agentloop.types import StopReason, Trajectory, Turn


def _seg(task: str, k: int, n: int, *, calls: int, response: int = 3, reward: float = 0.0,
         answer: str | None = None, **metrics: float) -> dict[str, Any]:  # fmt: skip
    """Segment ``k`` of ``n`` (``n`` 0: an episode in one piece): a 2-token prompt and one turn
    of ``response`` tokens that calls ``calls`` tools."""
    ids = (7,) * (2 + response)
    split = {"segments": float(n), "segment_index": float(k)} if n else {}
    t = Trajectory(
        task, ids, (0, 0) + (1,) * response, (0.0,) * len(ids), 2, reward, StopReason.DONE,
        turns=(Turn(0, 2, response, 0, "stop", tool_calls=calls),),
        metrics={"tool_calls": float(calls), **split, **metrics},
    )  # fmt: skip
    return {**trajectory_to_dict(t), "answer": answer, "answer_key": answer,
            "answer_correct": answer is not None}  # fmt: skip


def _summary(run: Path) -> EvalSummary:
    return summarize(read_episodes(run), env="e", model="m", split="test", samples_per_task=1,
                     pass_threshold=1.0, config_hash="h")  # fmt: skip


def _write(run: Path, records: list[dict[str, Any]]) -> Path:
    run.mkdir()
    (run / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_an_episode_counts_all_its_segments_and_only_its_finished_attempt(tmp_path: Path) -> None:
    # env metrics (tool_error/*) are the episode's, carried whole by every segment
    bad = {"tool_error/invalid_json": 1.0}
    run = _write(tmp_path / "run", [
        _seg("a", 0, 2, calls=1, reward=1.0, **bad),  # the tool call is in segment 0
        _seg("b", 0, 3, calls=5, response=50),  # a killed run's attempt, never finished
        _seg("a", 1, 2, calls=0, response=4, reward=1.0, answer="7", **bad),
        _seg("b", 0, 2, calls=1),  # the resumed run replays b from scratch
        _seg("b", 1, 2, calls=0, response=4),
        _seg("b", 0, 0, calls=9, reward=1.0),  # a later copy: the first finished one stands
    ])  # fmt: skip
    episodes = read_episodes(run)
    assert [(e.key, len(e.segments)) for e in episodes] == [(("a", 0), 2), (("b", 0), 2)]
    assert [r["metrics"]["segment_index"] for r in read_run(run)] == [1.0, 1.0]
    s = _summary(run)
    assert s.episodes == 2 and s.tasks == 2
    assert s.reward.mean == 0.5  # the final segments' rewards: a 1, b 0
    assert s.tool_calls_per_episode == 1.0  # each episode's call in segment 0
    assert s.mean_turns == 2.0
    assert s.mean_response_tokens == 3 + 4  # the killed attempt's 50 are not counted
    assert s.tool_error_rate == 0.5 and s.tool_errors == {"invalid_json": 0.5}  # once: 1 of 2
    assert s.answer_rate == 0.5  # a's final segment answered, b's did not
    assert s.stop_reasons == {"done": 2}


def test_a_run_without_segments_is_one_record_per_episode(tmp_path: Path) -> None:
    run = _write(tmp_path / "run", [
        _seg("a", 0, 0, calls=2, reward=1.0, answer="7"),
        _seg("b", 0, 1, calls=1, response=5, **{"tool_error/timeout": 1.0}),  # one segment
        _seg("a", 0, 0, calls=9, reward=0.0),  # a later copy: the first stands
    ])  # fmt: skip
    assert [len(e.segments) for e in read_episodes(run)] == [1, 1]
    assert [r["reward"] for r in read_run(run)] == [1.0, 0.0]
    s = _summary(run)
    assert (s.episodes, s.reward.mean, s.mean_turns) == (2, 0.5, 1.0)
    assert s.tool_calls_per_episode == 1.5 and s.mean_response_tokens == 4.0
    assert s.tool_errors == {"timeout": pytest.approx(1 / 3)}
    assert s.tool_failed == 1 and s.answer_rate == 0.5
