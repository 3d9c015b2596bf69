"""A run's metrics.jsonl reads back by step; a damaged line is a clean error naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentloop.errors import TrajectoryError
from agentloop.trainers.metrics import METRICS_FILE, read_metrics


def test_a_line_without_a_step_is_named_not_a_key_error(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1, "loss": 0.5}\n{"step": 1, "loss": 0.25}\n')
    assert read_metrics(tmp_path) == {1: {"step": 1, "loss": 0.25}}  # a resumed step: the last
    path.write_text('{"step": 1, "loss": 0.5}\n{"note": "not a record"}\n')
    with pytest.raises(TrajectoryError, match=rf"{METRICS_FILE}:2 lacks \['step'\]"):
        read_metrics(tmp_path)
