"""The DeepEyes demo's layered config: its family, base model, env, GPU overlay; no run."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentloop.errors import ConfigError
from agentloop.models.demo import FAMILIES, load_demo_configs
from agentloop.models.names import MODEL_NAMES

RECIPE_DIR = FAMILIES["deepeyes"].recipe_dir


def test_the_deepeyes_recipe_wires_the_zoom_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentloop.models.tiny_vlm import VLM_ENV_VAR

    monkeypatch.setenv(VLM_ENV_VAR, str(tmp_path / "vlm"))
    cfg = load_demo_configs(["demo.out_dir=/tmp/z", "demo.max_image_tokens=16"], "deepeyes")
    assert cfg.family.name == "deepeyes" and cfg.family.model_name in MODEL_NAMES
    assert cfg.sft.model.path == str(tmp_path / "vlm-px16")  # the base VLM of that budget
    assert cfg.sft.data.train == "/tmp/z/traces.jsonl" and cfg.grpo.model.path == "/tmp/z/sft/model"
    assert cfg.grpo.data.env == "agentloop/ZoomVQA-v0" and cfg.grpo.engine.backend == "hf"
    assert dict(cfg.grpo.data.env_kwargs) == {
        "layout": "grid",
        "reward": "deepeyes",
        "max_turns": 3,
    }
    assert cfg.grpo.data.env_kwargs["max_turns"] == cfg.grpo.rollout.max_turns
    with pytest.raises(ConfigError, match=r"RL must play them too"):
        load_demo_configs(["grpo.data.env_kwargs.reward=exact"], "deepeyes")
    with pytest.raises(ConfigError, match=r"wrong_box_rate=0.8 and demo.no_zoom_rate=0.3"):
        load_demo_configs(["demo.wrong_box_rate=0.8", "demo.no_zoom_rate=0.3"], "deepeyes")
    assert load_demo_configs(recipe=Path("recipes/tiny_deepeyes")).family.name == "deepeyes"


def test_the_gpu_overlay_runs_the_vlm_on_vllm_with_cuda_graphs() -> None:
    gpu = load_demo_configs(recipe="deepeyes", config=RECIPE_DIR / "gpu.yaml")
    assert (gpu.grpo.engine.backend, gpu.grpo.engine.enforce_eager) == ("vllm", False)
    assert (gpu.sft.actor.device, gpu.grpo.actor.device) == ("cuda", "cuda")
    assert (gpu.sft.actor.dtype, gpu.grpo.actor.dtype, gpu.grpo.engine.dtype) == ("bfloat16",) * 3
    assert gpu.demo.out_dir == "runs/demo-deepeyes-gpu" and gpu.sft.trainer.max_steps is None
