"""The Search-R1 demo's configs: the shipped recipe and its GPU overlay load and wire together."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentloop.errors import ConfigError
from agentloop.models.demo_recipes import FAMILIES, load_demo_configs
from agentloop.models.demo_search_r1 import SearchR1DemoConfig, make_search_r1_traces

GPU = Path(__file__).resolve().parents[2] / "recipes" / "tiny_search_r1" / "gpu.yaml"


def test_the_shipped_recipe_wires_traces_sft_and_grpo(tmp_path: Path) -> None:
    configs = load_demo_configs([f"demo.out_dir={tmp_path}"], recipe="search_r1")
    assert configs.family is FAMILIES["search_r1"] and configs.demo.family == "search_r1"
    assert configs.sft.data.train == str(tmp_path / "traces.jsonl")
    assert configs.sft.model.path == "tiny"
    assert configs.grpo.model.path == str(tmp_path / "sft" / "model")
    assert configs.grpo.data.env == "agentloop/SearchR1-v0"
    # one-hop questions only, and the cold start reused from the cache when it is there
    assert configs.demo.two_hop_rate == 0.0 and configs.demo.cached_cold_start is True
    assert configs.demo.files == {
        "train": str(tmp_path / "data" / "train.jsonl"),
        "test": str(tmp_path / "data" / "test.jsonl"),
    }
    # the same recipe from its dir (recipes/tiny_search_r1 links to the shipped files)
    again = load_demo_configs([f"demo.out_dir={tmp_path}"], recipe=str(GPU.parent))
    assert again.demo == configs.demo and again.grpo == configs.grpo


def test_the_gpu_overlay_is_a_bigger_model_on_cuda_with_cuda_graphs(tmp_path: Path) -> None:
    configs = load_demo_configs([f"demo.out_dir={tmp_path}"], recipe="search_r1", config=GPU)
    assert (configs.demo.hidden_size, configs.demo.num_layers) == (768, 12)
    assert configs.sft.model.path.endswith("768x12")
    assert configs.sft.actor.device == configs.grpo.actor.device == "cuda"
    assert configs.grpo.engine.enforce_eager is False and configs.grpo.engine.dtype == "bfloat16"
    steps, every = configs.grpo.trainer.total_steps, configs.grpo.trainer.val_every
    assert steps % every == 0  # the last validation is the RL checkpoint


def test_bad_settings_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"grpo data\.env='agentloop/Calc-v0'"):
        load_demo_configs(
            [f"demo.out_dir={tmp_path}", "grpo.data.env=agentloop/Calc-v0"], recipe="search_r1"
        )
    with pytest.raises(ConfigError, match="max_chars=500"):
        load_demo_configs(
            [f"demo.out_dir={tmp_path}", "grpo.data.env_kwargs.max_chars=500"], recipe="search_r1"
        )
    with pytest.raises(ConfigError, match=r"demo\.topk=0"):
        SearchR1DemoConfig(topk=0)
    with pytest.raises(ConfigError, match=r"demo\.retriever is empty"):
        make_search_r1_traces(SearchR1DemoConfig(out_dir=str(tmp_path)), tmp_path / "t.jsonl")
