"""Run config: YAML + key=value loading, derived batch sizes, and errors that name field and fix."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agentloop.cli import main
from agentloop.errors import ConfigError
from agentloop.rollout import RolloutConfig
from agentloop.trainers.config import (
    TrainConfig,
    batch_sizes,
    config_to_yaml,
    example_config,
    load_config,
)
from agentloop.trainers.worker import WorkerConfig

TINY = example_config("grpo_calc_tiny")


def test_the_shipped_example_loads_and_overrides_win() -> None:
    cfg = load_config(TrainConfig, TINY, ["trainer.total_steps=7", "rollout.n=2", "actor.lr=3e-5"])
    assert (cfg.trainer.total_steps, cfg.rollout.n, cfg.actor.lr) == (7, 2, 3e-5)
    assert cfg.rollout.max_response_len == 64  # from the YAML
    assert cfg.actor.weight_decay == WorkerConfig().weight_decay  # untouched default
    assert cfg.rollout.base() == RolloutConfig(
        **{f.name: getattr(cfg.rollout, f.name) for f in dataclasses.fields(RolloutConfig)}
    )
    assert cfg.engine.dtype == "float32" and cfg.engine.max_model_len is None
    settings = cfg.engine_settings()  # the derived settings filled in
    assert settings["max_model_len"] == 384 + 64 and settings["seed"] == cfg.trainer.seed


def test_the_engine_section_is_vllm_config_without_model_and_with_its_defaults() -> None:
    from agentloop.engines.vllm import VLLMConfig
    from agentloop.trainers.config import EngineConfig

    vllm = {f.name: f for f in dataclasses.fields(VLLMConfig)}
    section = {f.name: f for f in dataclasses.fields(EngineConfig)}
    assert set(section) == set(vllm) - {"model"}
    derived = {"max_model_len", "seed"}  # None: from the rollout budget and trainer.seed
    for name in set(section) - derived - {"engine_args"}:
        assert section[name].default == vllm[name].default, name


def test_yaml_round_trip(tmp_path: Path) -> None:
    cfg = load_config(TrainConfig, TINY, ["algorithm.dynamic_sampling=true"])
    path = tmp_path / "config.yaml"
    path.write_text(config_to_yaml(cfg))
    assert load_config(TrainConfig, path) == cfg


def test_batch_sizes_are_derived_and_described() -> None:
    overrides = ["trainer.placement=ray", "trainer.num_workers=2", "trainer.mini_batches=2",
                 "trainer.ppo_epochs=3", "trainer.prompts_per_step=8",
                 "actor.max_tokens_per_micro_batch=1000"]  # fmt: skip
    cfg = load_config(TrainConfig, TINY, overrides)
    sizes = batch_sizes(cfg, num_tasks=100)
    assert sizes.sequences_per_step == 8 * 4
    assert sizes.sequences_per_mini_batch == 16
    assert sizes.updates_per_step == 6
    assert sizes.sequences_per_worker == 8
    assert sizes.max_micro_batches_per_worker == 4  # 8 × 448 tokens in budgets of 1000
    assert sizes.steps_per_epoch == 12
    text = sizes.describe()
    assert "8 prompts × n=4 = 32 sequences per step" in text
    assert "2 mini-batch(es) of 16 sequences × 3 epoch(s) = 6 optimiser update(s)" in text


def test_the_loader_takes_any_dataclass_schema(tmp_path: Path) -> None:
    @dataclasses.dataclass(frozen=True)
    class Other:  # e.g. the SFT recipe's config
        rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
        epochs: int = 1

    path = tmp_path / "other.yaml"
    path.write_text("epochs: 3\nrollout:\n  max_turns: 2\n")
    cfg = load_config(Other, path, ["rollout.temperature=0.5"])
    assert (cfg.epochs, cfg.rollout.max_turns, cfg.rollout.temperature) == (3, 2, 0.5)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["actor.lrr=1"], r"actor\.lrr.*Did you mean.*'lr'"),
        (["actor.lr=fast"], r"actor\.lr.*could not be converted"),
        (["trainer.total_steps"], r"not key=value"),
        (["trainer.num_workers=2"], r"trainer\.num_workers=2 with trainer\.placement=local.*set"),
        (["trainer.mini_batches=3"], r"prompts_per_step=4 is not divisible by .*mini_batches=3"),
        (
            ["trainer.placement=ray", "trainer.num_workers=3"],
            r"8 sequences per mini-batch, not divisible by trainer\.num_workers=3",
        ),
        (["actor.temperature=0.7"], r"actor\.temperature=0\.7 but rollout\.temperature=1\.0"),
        (["algorithm.overlong_buffer=100"], r"overlong_buffer=100 exceeds .*max_response_len=64"),
        (["algorithm.dynamic_sampling=true", "rollout.n=1"], r"dynamic_sampling.*rollout\.n >= 2"),
        (["engine.kv_cache=1"], r"engine\.kv_cache: Key 'kv_cache' not in .* kv_cache_memory_b"),
        (["engine.weight_transport=nccl"], r"engine\.weight_transport: Invalid value 'nccl'"),
        (["engine.max_num_seqs=0"], r"engine\.max_num_seqs must be >= 1, got 0"),
        (["engine.engine_args={model: x}"], r"engine\.engine_args may not set \['model'\]"),
        (["algorithm.adv_estimator=ppo"], r"algorithm\.adv_estimator='ppo': must be one of"),
        (["trainer.placement=slurm"], r"trainer\.placement='slurm': must be one of"),
        (["rollout.replay=/no/such/dir"], r"rollout\.replay='/no/such/dir': is not a directory"),
        (["checkpoint.resume=/no/such/step"], r"checkpoint\.resume=.*'auto', 'never' or"),
        (["rollout.max_turns=0"], r"rollout\.max_turns must be >= 1"),
        (["actor.clip_ratio_low=1.5"], r"WorkerConfig\.clip_ratio_low=1\.5"),
    ],
)
def test_bad_values_name_the_field_and_the_fix(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(TrainConfig, TINY, overrides)


def test_a_missing_or_broken_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist.*grpo_calc_tiny\.yaml"):
        load_config(TrainConfig, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [1, 2\n")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(TrainConfig, bad)


def test_cli_prints_the_config_and_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--print-config", "grpo_calc_tiny", "trainer.total_steps=2"]) == 0
    out = capsys.readouterr().out
    assert "total_steps: 2" in out
    assert "4 prompts × n=4 = 16 sequences per step" in out


def test_cli_reports_config_errors_without_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(TINY), "trainer.mini_batches=3"]) == 2
    err = capsys.readouterr().err
    assert "agentloop train: error: trainer.prompts_per_step=4" in err
    assert "Traceback" not in err
