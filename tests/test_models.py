"""The models room: named models resolve at the entry points; reading a config builds nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentloop.errors import ConfigError
from agentloop.models import MODEL_NAMES, resolve_model, resolve_model_path
from agentloop.trainers.config import TrainConfig, load_config, local_model_dir

_READ_CONFIG = """
import json, sys
from agentloop.trainers.config import TrainConfig, load_config
cfg = load_config(TrainConfig, sys.argv[1])
print(json.dumps([cfg.model.path, sorted(m for m in sys.modules if m.startswith("agentloop."))]))
"""


def test_reading_a_config_that_names_tiny_calc_imports_no_trainer_and_builds_nothing(
    tmp_path: Path,
) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("model:\n  path: tiny-calc\n")
    cache = tmp_path / "cache" / "tiny"  # where tiny and tiny-calc would be built
    env = {"AGENTLOOP_TINY_MODEL": str(cache), "PATH": "/usr/bin:/bin"}
    env |= {k: v for k, v in os.environ.items() if k == "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", _READ_CONFIG, str(config)],
        capture_output=True, text=True, env=env, check=True, timeout=120,
    )  # fmt: skip
    path, modules = json.loads(out.stdout)
    assert path == "tiny-calc"
    loaded = set(modules)
    for module in ("grpo", "sft", "worker", "colocated", "group", "rollouts", "checkpoint"):
        assert f"agentloop.trainers.{module}" not in loaded
    assert not any(m.startswith(("agentloop.models", "agentloop.testing")) for m in loaded)
    assert not cache.parent.exists(), "reading a config built a model"


def test_resolve_model_keeps_a_directory_and_names_the_fix_for_anything_else(
    tmp_path: Path,
) -> None:
    cfg = load_config(TrainConfig, None, [f"model.path={tmp_path}"])
    assert resolve_model(cfg) is cfg  # already a directory: nothing to build
    assert resolve_model_path(str(tmp_path)) == tmp_path.resolve()
    with pytest.raises(
        ConfigError,
        match=r"model.path='nope'.*tiny, tiny-calc, tiny-search-r1, tiny-vlm, tiny-zoom",
    ):
        resolve_model_path("nope")
    assert MODEL_NAMES == ("tiny", "tiny-calc", "tiny-search-r1", "tiny-vlm", "tiny-zoom")


def test_resolve_model_replaces_a_name_by_its_built_directory(tiny_model_dir: Path) -> None:
    cfg = load_config(TrainConfig, None, ["model.path=tiny"])
    resolved = resolve_model(cfg)
    assert resolved.model.path == str(tiny_model_dir.resolve())
    assert resolved.rollout == cfg.rollout and cfg.model.path == "tiny"


def test_the_trainers_take_a_directory_and_say_who_resolves_a_name() -> None:
    with pytest.raises(ConfigError, match=r"model.path='tiny' is not a directory.*resolve_model"):
        local_model_dir("tiny")
