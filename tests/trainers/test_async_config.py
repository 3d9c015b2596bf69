"""The async-mode knobs of the run config: the example flips to async with one setting, and
inconsistent settings fail before anything starts, naming the value and the fix."""

from __future__ import annotations

import pytest

from agentloop.errors import ConfigError
from agentloop.trainers.config import TrainConfig, example_config, load_config

TINY = example_config("grpo_calc_tiny")


def test_the_example_runs_async_with_one_override() -> None:
    cfg = load_config(TrainConfig, TINY, ["trainer.mode=async"])
    t = cfg.trainer
    assert (t.mode, t.max_staleness, t.staleness_policy, t.push_every) == ("async", 1, "wait", 1)
    assert t.partial_rollouts and cfg.actor.tis_cap is not None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.mode=fast"], r"trainer.mode='fast': must be one of \('sync', 'one_step'"),
        (["trainer.staleness_policy=skip"], "must be one of \\('wait', 'drop'\\)"),
        (["trainer.mode=async", "actor.tis_cap=null"], "set actor.tis_cap"),
        (["trainer.push_every=2"], "push_every=2 needs trainer.mode=one_step or async"),
        (["trainer.mode=async", "trainer.push_every=3", "trainer.max_staleness=1"],
         "max_staleness=1 < trainer.push_every - 1 = 2"),
        (["trainer.mode=one_step", "trainer.push_every=2"], "one_step pushes the weights"),
        (["trainer.rollout_workers=2"], "rollout_workers=2 needs trainer.placement=ray"),
        (["trainer.max_staleness=-1"], "must be >= 0"),
        (["trainer.batch_timeout_s=0"], "must be > 0"),
        (["ray.restart_timeout_s=0"], "restart_timeout_s=0.0: must be > 0"),
    ],
)  # fmt: skip
def test_bad_async_settings_are_named(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(TrainConfig, TINY, overrides)


def test_replay_needs_sync_mode(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match=r"rollout\.replay trains on saved batches"):
        load_config(TrainConfig, TINY, [f"rollout.replay={tmp_path}", "trainer.mode=one_step"])
