"""The demo's layered config (demo./sft./grpo. overrides): checked in milliseconds, no run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agentloop.models.demo import FAMILIES, load_demo_configs
from agentloop.trainers.config import example_config, load_config
from agentloop.trainers.sft import SFTConfig

RECIPE_DIR = FAMILIES["retool"].recipe_dir


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
    # a folder whose name YAML would read as a mapping reaches every stage as the same string
    cfg = load_demo_configs(["demo.out_dir='runs/a: b'"])
    assert cfg.sft.data.train == "runs/a: b/traces.jsonl"
    assert cfg.grpo.model.path == "runs/a: b/sft/model"


def test_a_config_file_layers_over_the_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``agentloop demo --config FILE``: the file's sections override the recipe, key=value
    overrides override the file, and a base model shape other than the tiny model's points SFT
    at that model (the shipped GPU overlay: 768 x 12)."""
    from agentloop.errors import ConfigError
    from agentloop.models.tiny import ENV_VAR

    monkeypatch.setenv(ENV_VAR, str(tmp_path / "tiny"))
    gpu = load_demo_configs(["grpo.trainer.total_steps=3"], config=RECIPE_DIR / "gpu.yaml")
    assert gpu.sft.model.path == str(tmp_path / "tiny-768x12")
    assert (gpu.sft.actor.device, gpu.grpo.actor.device, gpu.grpo.engine.enforce_eager) == (
        "cuda",
        "cuda",
        False,
    )
    assert gpu.grpo.trainer.total_steps == 3 and gpu.grpo.data.env_kwargs == {"digits": 2}
    overlay = tmp_path / "mine.yaml"
    overlay.write_text(
        "demo: {out_dir: 'runs/#a b', num_layers: 2}\n"
        "sft: {actor: {betas: [0.8, 0.9]}, trainer: {max_steps: null}}\n"
        "grpo: {data: {env_kwargs: {digits: 2}}}\n"
    )
    mine = load_demo_configs(config=overlay)
    assert mine.demo.out_dir == "runs/#a b" and mine.sft.actor.betas == (0.8, 0.9)
    assert mine.sft.trainer.max_steps is None
    assert mine.sft.model.path == str(tmp_path / "tiny-256x2")
    assert load_demo_configs().sft.model.path == "tiny"  # the tiny shape: the recipe's own
    overlay.write_text("trainer: {total_steps: 3}\n")
    with pytest.raises(ConfigError, match=r"top-level keys \['trainer'\]; use only"):
        load_demo_configs(config=overlay)
    with pytest.raises(ConfigError, match="multiple of 128"):
        load_demo_configs(["demo.hidden_size=100"])


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


def test_a_recipe_is_a_family_name_or_a_dir_whose_demo_yaml_names_its_family(
    tmp_path: Path,
) -> None:
    import shutil

    from agentloop.errors import ConfigError

    assert load_demo_configs(recipe="retool").family.name == "retool"
    with pytest.raises(ConfigError, match=r"--recipe 'nope' is neither a demo family \(retool"):
        load_demo_configs(recipe="nope")
    mine = tmp_path / "mine"
    shutil.copytree(RECIPE_DIR, mine)
    assert load_demo_configs(recipe=mine).family.name == "retool"
    (mine / "demo.yaml").write_text("family: zoomer\n")
    with pytest.raises(ConfigError, match=r"no demo family 'zoomer'; pass --recipe one of retool"):
        load_demo_configs(recipe=mine)
    with pytest.raises(ConfigError, match=r"demo.family='x' but the recipe in .* is the 'retool'"):
        load_demo_configs(["demo.family=x"])


def test_the_demo_command_names_an_unknown_recipe_and_exits_non_zero() -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "agentloop.cli", "demo", "--recipe", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--recipe 'nope' is neither a demo family" in proc.stderr + proc.stdout
