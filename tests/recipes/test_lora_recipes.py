"""The 7B recipes' one-GPU LoRA variant (docs/guides/training.md, LoRA): the documented
overrides load on each recipe, run one worker with adapter-only weight sync, and keep the
recipe's own batch structure."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RECIPES

from agentloop.errors import ConfigError
from agentloop.trainers.config import TrainConfig, batch_sizes, load_config

LORA = ["actor.lora.rank=64", "actor.lora.alpha=128", "actor.lr=1e-5", "trainer.num_workers=1"]


@pytest.mark.parametrize(
    ("recipe", "name", "prompts", "sequences"),
    [("retool", "dapo_7b", 8, 128), ("search_r1", "grpo_7b", 64, 320),
     ("deepeyes", "grpo_7b", 16, 128)],
)  # fmt: skip
def test_the_documented_lora_overrides_load_on_each_7b_recipe(
    tiny_model_dir: Path, recipe: str, name: str, prompts: int, sequences: int
) -> None:
    overrides = [*LORA, f"trainer.prompts_per_step={prompts}", f"model.path={tiny_model_dir}"]
    cfg = load_config(TrainConfig, RECIPES / recipe / f"{name}.yaml", overrides)
    sizes = batch_sizes(cfg, num_tasks=10_000)
    assert sizes.num_workers == 1 and sizes.sequences_per_step == sequences
    assert cfg.actor.lora.rank == 64 and cfg.engine_lora_rank == 64  # adapter-only sync
    assert cfg.engine_settings()["lora_rank"] == 64
    assert cfg.actor.dtype == "bfloat16"  # the frozen base is kept in bf16 on the GPU


def test_engine_lora_rank_must_be_the_policys_or_zero(tiny_model_dir: Path) -> None:
    base = [f"model.path={tiny_model_dir}", "actor.lora.rank=8"]
    with pytest.raises(ConfigError, match=r"engine\.lora_rank=16 but actor\.lora\.rank=8"):
        load_config(TrainConfig, None, [*base, "engine.lora_rank=16"])
    merged = load_config(TrainConfig, None, [*base, "engine.lora_rank=0"])
    assert merged.engine_lora_rank == 0  # merged full-weight sync
    hf = load_config(TrainConfig, None, [*base, "engine.backend=hf"])
    assert hf.engine_lora_rank == 0  # the HF engine takes merged weights
    with pytest.raises(ConfigError, match=r"adapter-only weight sync.*colocated"):
        load_config(TrainConfig, None, [*base, "engine.lora_rank=8", "engine.backend=hf"])
