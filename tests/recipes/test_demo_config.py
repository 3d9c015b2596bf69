"""The demo's layered config (demo./sft./grpo. overrides): checked in milliseconds, no run."""

from __future__ import annotations

import dataclasses

import pytest

from agentloop.trainers.config import example_config, load_config
from agentloop.trainers.demo import RECIPE_DIR, load_demo_configs
from agentloop.trainers.sft import SFTConfig


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


def test_sft_calc_recipe_is_the_demos() -> None:
    """The shipped SFT recipe and the demo's cold start train alike: only the data path, the
    output dir, the held-out evaluation interval (which does not change training) and the
    device (the recipe takes a GPU where there is one, the demo pins the CPU) differ."""
    recipe = load_config(SFTConfig, example_config("sft_calc_tiny"))
    demo = load_config(SFTConfig, RECIPE_DIR / "sft.yaml")
    assert recipe.model == demo.model
    assert dataclasses.replace(recipe.actor, device=demo.actor.device) == demo.actor
    assert recipe.data.eval_fraction == demo.data.eval_fraction
    assert recipe.data.max_seq_len == demo.data.max_seq_len
    for key in ("epochs", "max_steps", "batch_size", "lr_schedule"):
        assert getattr(recipe.trainer, key) == getattr(demo.trainer, key), key
