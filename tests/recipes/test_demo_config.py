"""The demo's layered config (demo./sft./grpo. overrides): checked in milliseconds, no run."""

from __future__ import annotations

import pytest

from agentloop.trainers.demo import load_demo_configs


def test_every_demo_override_section_is_checked() -> None:
    from agentloop.errors import ConfigError

    with pytest.raises(ConfigError, match=r"must start with one of \['demo.', 'sft.', 'grpo.'\]"):
        load_demo_configs(["trainer.total_steps=3"])
    with pytest.raises(ConfigError, match=r"digits=3 but demo.digits=2"):
        load_demo_configs(["grpo.data.env_kwargs.digits=3"])
    with pytest.raises(ConfigError, match=r"val_before_train=true"):
        load_demo_configs(["grpo.trainer.val_before_train=false"])
    cfg = load_demo_configs(["demo.out_dir=/tmp/x", "sft.trainer.max_steps=7"])
    assert cfg.sft.data.train == "/tmp/x/traces.jsonl" and cfg.sft.trainer.max_steps == 7
    assert cfg.grpo.model.path == "/tmp/x/sft/model" and cfg.grpo.trainer.out_dir == "/tmp/x/rl"
