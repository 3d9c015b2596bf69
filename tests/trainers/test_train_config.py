"""Run config: YAML + key=value loading, derived batch sizes, and errors that name field and fix."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import socket
import warnings
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
from agentloop.trainers.notices import NOTICES_FILE, RunNotice, RunNotices
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
    """Plus ``backend`` (vllm or hf), which picks the engine these settings go to."""
    from agentloop.engines.vllm import VLLMConfig
    from agentloop.trainers.config import EngineConfig

    vllm = {f.name: f for f in dataclasses.fields(VLLMConfig)}
    section = {f.name: f for f in dataclasses.fields(EngineConfig)}
    assert set(section) == set(vllm) - {"model"} | {"backend"}
    assert section["backend"].default == "vllm"
    # None: from the rollout budget, trainer.seed and actor.lora
    derived = {"max_model_len", "seed", "lora_rank"}
    for name in set(section) - derived - {"engine_args", "backend"}:
        assert section[name].default == vllm[name].default, name


def test_yaml_round_trip(tmp_path: Path) -> None:
    cfg = load_config(TrainConfig, TINY, ["algorithm.dynamic_sampling=true"])
    path = tmp_path / "config.yaml"
    path.write_text(config_to_yaml(cfg))
    assert load_config(TrainConfig, path) == cfg


def test_batch_sizes_are_derived_and_described() -> None:
    overrides = ["trainer.placement=ray", "trainer.num_workers=2", "trainer.mini_batches=2",
                 "trainer.ppo_epochs=3", "trainer.prompts_per_step=8", "rollout.n=4",
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
        (["trainer.mini_batches=3"], r"prompts_per_step=8 is not divisible by .*mini_batches=3"),
        (
            ["trainer.placement=ray", "trainer.num_workers=3"],
            r"64 sequences per mini-batch, not divisible by trainer\.num_workers=3",
        ),
        (["actor.temperature=0.7"], r"actor\.temperature=0\.7 but rollout\.temperature=1\.0"),
        (["algorithm.overlong_buffer=100"], r"overlong_buffer=100 exceeds .*max_response_len=64"),
        (["algorithm.dynamic_sampling=true", "rollout.n=1"], r"dynamic_sampling.*rollout\.n >= 2"),
        (["engine.kv_cache=1"], r"engine\.kv_cache: Key 'kv_cache' not in .* kv_cache_memory_b"),
        (["engine.weight_transport=nccl"], r"engine\.weight_transport: Invalid value 'nccl'"),
        (["engine.backend=sglang"], r"engine\.backend: Invalid value 'sglang'"),
        (["engine.max_num_seqs=0"], r"engine\.max_num_seqs must be >= 1, got 0"),
        (["engine.engine_args={model: x}"], r"engine\.engine_args may not set \['model'\]"),
        (["algorithm.adv_estimator=ppo"], r"algorithm\.adv_estimator='ppo': must be one of"),
        (["trainer.placement=slurm"], r"trainer\.placement='slurm': must be one of"),
        (["rollout.replay=/no/such/dir"], r"rollout\.replay='/no/such/dir': is not a directory"),
        (["checkpoint.resume=/no/such/step"], r"checkpoint\.resume=.*'auto', 'never' or"),
        (["rollout.max_turns=0"], r"rollout\.max_turns must be >= 1"),
        (["actor.clip_ratio_low=1.5"], r"WorkerConfig\.clip_ratio_low=1\.5"),
        (
            ["rollout.n=1", "algorithm.dynamic_sampling=false"],
            r"rollout\.n=1 with algorithm\.adv_estimator=grpo: .*no baseline.*n >= 2",
        ),
        (
            ["rollout.n=1", "algorithm.dynamic_sampling=false", "algorithm.adv_estimator=rloo"],
            r"rollout\.n=1 with algorithm\.adv_estimator=rloo.*reinforce_plus_plus",
        ),
        (
            ["actor.policy_loss=gspo"],
            r"policy_loss=gspo with actor\.loss_agg_mode=token-mean.*set actor\.loss_agg_mode="
            r"seq-mean-token-mean",
        ),
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
    assert "8 prompts × n=8 = 64 sequences per step" in out


def test_cli_reports_config_errors_without_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(TINY), "trainer.mini_batches=3"]) == 2
    err = capsys.readouterr().err
    assert "agentloop train: error: trainer.prompts_per_step=8" in err
    assert "Traceback" not in err


def test_allowed_degenerate_settings_are_notices() -> None:
    """lr=0 (a pipeline check) and KL twice (an ablation) are allowed, but each is a notice
    that the run warns about and records; REINFORCE++ with n=1 and GSPO done right are fine."""
    assert load_config(TrainConfig, TINY).notices() == ()
    ok = ["rollout.n=1", "algorithm.dynamic_sampling=false"]
    ok += ["algorithm.adv_estimator=reinforce_plus_plus"]
    ok += ["actor.policy_loss=gspo", "actor.loss_agg_mode=seq-mean-token-mean"]
    assert load_config(TrainConfig, TINY, ok).notices() == ()
    lr0, kl2 = load_config(
        TrainConfig, TINY, ["actor.lr=0", "actor.kl_coef=0.01", "algorithm.use_kl_in_reward=true"]
    ).notices()
    assert lr0.startswith("actor.lr=0: the optimiser never changes the weights")
    assert "as a loss term (actor.kl_coef=0.01) and as a reward penalty" in kl2


def test_agentloop_train_shows_and_records_the_notices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_model_dir: Path
) -> None:
    """Through the CLI: --print-config lists a notice under the config, and a run records it in
    its notices.jsonl (with a warning) before anything else; here the run then stops at its
    start-up check (no sandbox server answers), so no engine is started. With the example's
    named model (``tiny-calc``, built on first use) the same dead sandbox fails before the
    build, without a run dir."""
    assert main(["train", str(TINY), "actor.lr=0", "--print-config"]) == 0
    assert (
        "# notice: actor.lr=0: the optimiser never changes the weights" in capsys.readouterr().out
    )
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{free.getsockname()[1]}"
    out = tmp_path / "run"
    args = ["train", str(TINY), "actor.lr=0", f"trainer.out_dir={out}", "logging.progress=false",
            f"data.env_kwargs.sandbox={dead}"]  # fmt: skip
    assert main(args) == 2  # tiny-calc is not built: the dead sandbox is named first
    assert f"sandbox server {dead} does not answer" in capsys.readouterr().err
    assert not out.exists()
    with pytest.warns(RunNotice, match=r"actor\.lr=0"):
        assert main([*args, f"model.path={tiny_model_dir}"]) == 2
    assert f"sandbox server {dead} does not answer" in capsys.readouterr().err
    [record] = [json.loads(line) for line in (out / NOTICES_FILE).read_text().splitlines()]
    assert record["message"].startswith("actor.lr=0: the optimiser never changes the weights")


def test_a_notice_warns_once_and_is_kept_in_the_run_dir(tmp_path: Path) -> None:
    notices = RunNotices(tmp_path)
    with pytest.warns(RunNotice, match=r"actor\.lr=0: .*trains nothing"):
        notices.note("lr", "actor.lr=0: trains nothing", step=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        notices.note("lr", "actor.lr=0: trains nothing")  # once per run
    [record] = [json.loads(line) for line in (tmp_path / NOTICES_FILE).read_text().splitlines()]
    assert (record["key"], record["message"]) == ("lr", "actor.lr=0: trains nothing")


def test_wandb_is_off_by_default_and_an_error_when_asked_for_but_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_config(TrainConfig).logging.wandb is False
    cfg = load_config(TrainConfig, TINY, ["logging.wandb=true"])
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"logging\.wandb=true but the wandb package is not "):
        cfg.logging.check_available()


async def test_an_update_short_of_mini_batches_warns_once_and_records_it(tmp_path: Path) -> None:
    """Filtering can leave fewer sequences than workers × mini-batches: the update uses fewer
    mini-batches (not an error: it is random), and the run says so once and keeps a notice."""
    from agentloop.trainers.grpo import _Run, _update

    class TwoWorkers:
        world_size = 2

        async def train_step(self, chunk: list[object]) -> dict[str, float]:
            return {"loss": float(len(chunk))}

    overrides = ["trainer.placement=ray", "trainer.num_workers=2", "trainer.mini_batches=2"]
    cfg = load_config(TrainConfig, TINY, overrides)
    run = _Run(cfg, tmp_path, tmp_path, None, None, TwoWorkers(), notices=RunNotices(tmp_path))  # type: ignore[arg-type]
    with pytest.warns(RunNotice, match=r"step 3: only 3 sequences .* used 1 mini-batch\(es\) "):
        metrics = await _update(run, [object()] * 3, 3)  # type: ignore[list-item]
    assert metrics["actor/updates"] == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (await _update(run, [object()] * 2, 4))["actor/updates"] == 1.0  # type: ignore[list-item]
    assert [json.loads(x)["step"] for x in (tmp_path / NOTICES_FILE).read_text().splitlines()] == [
        3
    ]


@pytest.mark.parametrize("name", ["dapo_7b", "dapo_32b"])
def test_the_retool_dapo_recipes_are_dapo(name: str) -> None:
    """DAPO = clip-higher + token-mean + overlong shaping + dynamic sampling (on accuracy)."""
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "retool" / f"{name}.yaml"
    cfg = load_config(TrainConfig, recipe)
    a, actor = cfg.algorithm, cfg.actor
    assert (a.dynamic_sampling, a.filter_metric, a.overlong_buffer > 0) == (True, "correct", True)
    assert (actor.clip_ratio_high > actor.clip_ratio_low, actor.loss_agg_mode) == (
        True,
        "token-mean",
    )
