"""Run guards: a run stops after N steps whose rollouts all failed; rising tool errors warn."""

from __future__ import annotations

import logging

import pytest

from agentloop.errors import ConfigError
from agentloop.trainers.config import TrainConfig, load_config
from agentloop.trainers.guards import RolloutsFailedError, RunGuard
from agentloop.types import Message, StopReason, Trajectory

DOWN = "Error: tool 'python' failed: the sandbox could not run the code: sandbox server X is down"


def _traj(stop: StopReason = StopReason.DONE, *, calls: int = 0, failed: int = 0) -> Trajectory:
    metrics = {"tool_calls": float(calls), "tool_errors": float(failed),
               "tool_error/tool_exception": float(failed)}  # fmt: skip
    messages = (Message("tool", DOWN),) if failed else ()
    error = "InferenceError: engine gone" if stop.is_error else None
    return Trajectory("t", (1, 2), (0, 1), (0.0, -0.1), 1, 0.0, stop, messages=messages,
                      metrics=metrics, error=error)  # fmt: skip


def test_what_counts_as_a_failed_rollout() -> None:
    assert _traj(StopReason.ENGINE_ERROR).service_failed
    assert _traj(calls=2, failed=1).service_failed  # a call hit a dead service
    assert not _traj(calls=0).service_failed  # answered without tools
    assert not _traj(StopReason.MAX_TURNS, calls=1, failed=0).service_failed


def _garbled() -> Trajectory:
    """Only a malformed call: the policy's error, which says nothing about the services."""
    t = _traj(calls=1)
    return Trajectory(t.task_id, t.token_ids, t.loss_mask, t.logprobs, t.prompt_len, 0.0,
                      t.stop_reason, metrics={"tool_calls": 1.0, "tool_errors": 1.0,
                                              "tool_error/invalid_json": 1.0})  # fmt: skip


def test_the_run_stops_after_n_failed_steps_with_the_error() -> None:
    guard = RunGuard(max_failed_steps=2)
    dead = [_traj(calls=1, failed=1), _traj(calls=1, failed=1), _traj(calls=0), _garbled()]
    assert guard.check(1, dead, 1.0)["rollout/failed_frac"] == pytest.approx(2 / 4)
    assert not guard.should_stop
    guard.check(2, [_traj(calls=1, failed=0)], 0.0)  # the tools worked: the count restarts
    guard.check(3, dead, 1.0)
    guard.check(4, [_traj(calls=0), _garbled()], 0.5)  # shows nothing either way
    assert not guard.should_stop
    assert guard.failed_streak == 1
    guard.check(5, [*dead, _traj(calls=2, failed=1)], 0.5)  # a call gave a result
    assert guard.failed_streak == 0
    guard.check(6, dead, 1.0)
    guard.check(7, [_garbled()], 1.0)
    guard.check(8, dead, 1.0)
    assert guard.should_stop
    with pytest.raises(RolloutsFailedError, match=r"step 8: the rollouts of the last 2 steps"):
        raise guard.stop(8, dead)
    assert "sandbox server X is down" in str(guard.stop(8, dead))
    never = RunGuard(max_failed_steps=0)
    for step in range(5):
        never.check(step, dead, 1.0)
    assert not never.should_stop


def test_a_rising_tool_error_rate_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    guard = RunGuard(max_failed_steps=0, warn_rise=0.25)
    ok = [_traj(calls=1)]
    with caplog.at_level(logging.WARNING, logger="agentloop.trainers.guards"):
        for step, rate in enumerate([0.05, 0.1, 0.05, 0.6, 0.7], 1):
            guard.check(step, ok, rate)
    rising = [r for r in caplog.records if "tool-error rate rose" in r.getMessage()]
    assert len(rising) == 1 and "step 4" in rising[0].getMessage()


def test_the_guards_are_trainer_settings() -> None:
    cfg = load_config(TrainConfig, None, ["trainer.max_failed_steps=5"])
    assert cfg.trainer.max_failed_steps == 5 and cfg.trainer.tool_error_warn_rise == 0.25
    with pytest.raises(ConfigError, match=r"trainer.max_failed_steps=-1: must be >= 0"):
        load_config(TrainConfig, None, ["trainer.max_failed_steps=-1"])
