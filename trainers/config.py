"""Training-run configuration: OmegaConf structured dataclasses, YAML + key=value loading, checks.

Every default lives once, in a dataclass: the rollout limits in :class:`RolloutConfig`, the
optimiser and loss in :class:`WorkerConfig`, the vLLM settings in :class:`VLLMConfig` (the
``engine`` section reads its defaults from there), the rest here. Each field's docstring (the
string under it) says what the key does; ``--print-config`` prints it above the key.
:func:`load_config` merges a YAML file and ``key=value`` overrides onto a schema and builds the
frozen dataclasses, whose ``__post_init__`` checks name the field and the fix. It takes any
dataclass schema, so the SFT recipe loads its own config with it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from agentloop.errors import ConfigError
from agentloop.model_files import check_model_dir
from agentloop.trainers.choices import ESTIMATOR_SPECS
from agentloop.trainers.config_data import (
    AlgorithmConfig,
    DataConfig,
    ModelConfig,
    TrainRolloutConfig,
)
from agentloop.trainers.config_infra import (
    CheckpointConfig,
    EngineConfig,
    LoggingConfig,
    RayConfig,
    TrainerConfig,
)
from agentloop.trainers.config_text import config_to_yaml
from agentloop.trainers.worker_config import WorkerConfig

__all__ = [
    "AlgorithmConfig",
    "BatchSizes",
    "CheckpointConfig",
    "DataConfig",
    "EngineConfig",
    "LoggingConfig",
    "ModelConfig",
    "RayConfig",
    "TrainConfig",
    "TrainRolloutConfig",
    "TrainerConfig",
    "batch_sizes",
    "config_to_yaml",
    "example_config",
    "load_config",
    "local_model_dir",
]

T = TypeVar("T")


@dataclass(frozen=True)
class TrainConfig:
    """A whole GRPO/DAPO run, one section per concern; ``__post_init__`` checks the rules
    that span sections (batch divisibility, matching temperatures, mode requirements)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The model to train."""
    data: DataConfig = field(default_factory=DataConfig)
    """The env and its task splits."""
    rollout: TrainRolloutConfig = field(default_factory=TrainRolloutConfig)
    """Episode limits, sampling, and group size."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages, KL in the reward, DAPO dynamic sampling and overlong shaping."""
    actor: WorkerConfig = field(default_factory=WorkerConfig)
    """The policy worker: optimiser, sharding, precision and the loss."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Each vLLM engine replica."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Step structure, placement, validation and the sync/async mode."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Ray cluster and resources (``trainer.placement=ray``)."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoints, resume and the final export."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Metric sinks."""

    def __post_init__(self) -> None:
        t, r, a = self.trainer, self.rollout, self.algorithm
        per_mini = t.prompts_per_step // t.mini_batches * r.n
        rules = [
            (
                t.placement == "ray" or t.num_workers == 1,
                f"trainer.num_workers={t.num_workers} with trainer.placement=local: local mode "
                "is one process; set trainer.placement=ray, or trainer.num_workers=1",
            ),
            (
                t.prompts_per_step % t.mini_batches == 0,
                f"trainer.prompts_per_step={t.prompts_per_step} is not divisible by trainer."
                f"mini_batches={t.mini_batches}; every mini-batch must hold whole groups: make "
                "prompts_per_step a multiple of mini_batches",
            ),
            (
                per_mini % t.num_workers == 0,
                f"trainer.prompts_per_step={t.prompts_per_step} / trainer.mini_batches="
                f"{t.mini_batches} × rollout.n={r.n} = {per_mini} sequences per mini-batch, not "
                f"divisible by trainer.num_workers={t.num_workers}: each worker needs an equal "
                "share; change prompts_per_step, n or mini_batches",
            ),
            (
                math.isclose(self.actor.temperature, r.temperature),
                f"actor.temperature={self.actor.temperature} but rollout.temperature="
                f"{r.temperature}: the trainer must score tokens at the sampling temperature; set "
                "both to the same value",
            ),
            (
                a.overlong_buffer <= r.max_response_len,
                f"algorithm.overlong_buffer={a.overlong_buffer} exceeds rollout.max_response_len="
                f"{r.max_response_len}; use about a quarter of max_response_len, or 0 (off)",
            ),
            (
                not a.dynamic_sampling or r.n >= 2,
                "algorithm.dynamic_sampling=true needs rollout.n >= 2 (it drops groups whose "
                f"samples all score the same), got n={r.n}",
            ),
            *self._algorithm_rules(),
            *self._mode_rules(),
        ]
        for ok, message in rules:
            if not ok:
                raise ConfigError(message)

    def _algorithm_rules(self) -> list[tuple[bool, str]]:
        """Combinations that are accepted by each section yet train something else than asked."""
        r, a, actor = self.rollout, self.algorithm, self.actor
        estimator = ESTIMATOR_SPECS[a.adv_estimator]
        return [
            (
                # verl refuses it too: the group is the baseline of GRPO and RLOO
                r.n >= 2 or not estimator.group_baseline,
                f"rollout.n={r.n} with algorithm.adv_estimator={a.adv_estimator}: a group of one "
                "sample has no baseline to compare its reward with, so the advantages are not "
                f"{a.adv_estimator}'s; set rollout.n >= 2 (e.g. 8), or use "
                "algorithm.adv_estimator=reinforce_plus_plus (a batch-wide baseline)",
            ),
            (
                not estimator.per_turn or not a.use_kl_in_reward,
                f"algorithm.adv_estimator={a.adv_estimator} with algorithm.use_kl_in_reward=true: "
                "the turn-level estimator takes per-turn rewards only; use actor.kl_coef (KL as "
                "a loss term) instead",
            ),
            (
                # GSPO's objective is a mean over sequences of their length-normalised ratio
                actor.policy_loss != "gspo" or actor.loss_agg_mode == "seq-mean-token-mean",
                f"actor.policy_loss=gspo with actor.loss_agg_mode={actor.loss_agg_mode}: GSPO's "
                "sequence-level objective averages over sequences (verl fixes it); set "
                "actor.loss_agg_mode=seq-mean-token-mean",
            ),
        ]

    def notices(self) -> tuple[str, ...]:
        """Legitimate but unusual settings a run warns about once and records in its
        ``notices.jsonl`` (they are allowed: debugging runs and ablations use them)."""
        a, actor = self.algorithm, self.actor
        found = []
        if actor.lr == 0:
            found.append(
                "actor.lr=0: the optimiser never changes the weights, so this run trains nothing "
                "(fine for a pipeline check; set actor.lr, e.g. 1e-6, to learn)"
            )
        if actor.kl_coef > 0 and a.use_kl_in_reward:
            found.append(
                f"KL to the reference is used twice: as a loss term (actor.kl_coef="
                f"{actor.kl_coef}) and as a reward penalty (algorithm.use_kl_in_reward=true, "
                f"kl_reward_coef={a.kl_reward_coef}); usually one is meant: set actor.kl_coef=0 "
                "or algorithm.use_kl_in_reward=false"
            )
        return tuple(found)

    def _mode_rules(self) -> list[tuple[bool, str]]:
        t, r = self.trainer, self.rollout
        return [
            (
                t.mode == "sync" or self.actor.tis_cap is not None,
                f"trainer.mode={t.mode} trains on tokens sampled by older weights, and the "
                "decoupled PPO objective corrects for that with the importance weight "
                "min(π_old/π_behaviour, actor.tis_cap): set actor.tis_cap (e.g. 2.0)",
            ),
            (
                t.mode != "sync" or t.push_every == 1,
                f"trainer.push_every={t.push_every} needs trainer.mode=one_step or async; sync "
                "mode pushes the weights after every step",
            ),
            (
                t.mode != "async" or t.max_staleness >= t.push_every - 1,
                f"trainer.max_staleness={t.max_staleness} < trainer.push_every - 1 = "
                f"{t.push_every - 1}: the engines would fall further behind than the bound allows "
                "and the rollout side could never start a group; raise max_staleness or lower "
                "push_every",
            ),
            (
                t.mode != "one_step" or t.push_every == 1,
                "trainer.mode=one_step pushes the weights after every step; leave push_every at 1 "
                "or use trainer.mode=async",
            ),
            (
                t.mode == "sync" or r.replay is None,
                f"rollout.replay trains on saved batches, which needs trainer.mode=sync, not "
                f"{t.mode}",
            ),
            (
                t.rollout_workers == 0 or t.placement == "ray",
                f"trainer.rollout_workers={t.rollout_workers} needs trainer.placement=ray "
                "(separate rollout actors); local placement colocates the one engine",
            ),
            (
                self.engine.lora_rank in (None, 0, self.actor.lora.rank),
                f"engine.lora_rank={self.engine.lora_rank} but actor.lora.rank="
                f"{self.actor.lora.rank}: the engines' adapter slot holds the policy's adapter; "
                "leave engine.lora_rank unset, or 0 to sync merged full weights",
            ),
            (
                not self.engine.lora_rank
                or (self.engine.backend == "vllm" and t.rollout_workers == 0),
                "engine.lora_rank > 0 (adapter-only weight sync) needs vLLM engines colocated "
                "with the trainer (engine.backend=vllm, trainer.rollout_workers=0); set "
                "engine.lora_rank=0 to sync merged weights",
            ),
        ]

    @property
    def needs_ref(self) -> bool:
        """A frozen reference model is loaded when KL is used, as a loss or as a reward term."""
        return self.actor.kl_coef > 0 or self.algorithm.use_kl_in_reward

    def engine_settings(self) -> dict[str, Any]:
        """The settings of each engine replica, as
        :func:`~agentloop.engines.backends.start_train_engine` takes them: ``backend`` and the
        :class:`VLLMConfig` fields (everything but ``model``), the derived ones filled in."""
        r, e = self.rollout, self.engine
        settings = dataclasses.asdict(e)
        if e.max_model_len is None:
            settings["max_model_len"] = r.max_prompt_len + r.max_response_len
        if e.seed is None:
            settings["seed"] = self.trainer.seed
        settings["lora_rank"] = self.engine_lora_rank
        return settings

    @property
    def engine_lora_rank(self) -> int:
        """The engines' LoRA slot (``engine.lora_rank`` resolved): > 0 when each weight sync
        sends the policy's adapter alone, 0 when it sends full (merged) weights."""
        e, t = self.engine, self.trainer
        if e.lora_rank is not None:
            return e.lora_rank
        colocated_vllm = e.backend == "vllm" and t.rollout_workers == 0
        return self.actor.lora.rank if colocated_vllm else 0


@dataclass(frozen=True)
class BatchSizes:
    """The sizes one step works with, derived from the config (printed at start-up)."""

    prompts_per_step: int
    n: int
    sequences_per_step: int
    mini_batches: int
    sequences_per_mini_batch: int
    ppo_epochs: int
    updates_per_step: int
    num_workers: int
    sequences_per_worker: int
    max_seq_len: int
    max_micro_batches_per_worker: int
    steps_per_epoch: int | None

    def describe(self) -> str:
        epoch = (
            f"{self.steps_per_epoch} steps per pass over the data" if self.steps_per_epoch else ""
        )
        return "\n".join(
            [
                f"batch: {self.prompts_per_step} prompts × n={self.n} = {self.sequences_per_step} "
                f"sequences per step" + (f"; {epoch}" if epoch else ""),
                f"updates: {self.mini_batches} mini-batch(es) of {self.sequences_per_mini_batch} "
                f"sequences × {self.ppo_epochs} epoch(s) = {self.updates_per_step} optimiser "
                "update(s) per step",
                f"workers: {self.num_workers} × {self.sequences_per_worker} sequences per update, "
                f"at most {self.max_micro_batches_per_worker} micro-batch(es) each "
                f"(sequences up to {self.max_seq_len} tokens)",
            ]
        )


def batch_sizes(cfg: TrainConfig, num_tasks: int | None = None) -> BatchSizes:
    """The derived sizes of ``cfg``; ``num_tasks`` (the train split's size) adds steps/epoch."""
    t, r = cfg.trainer, cfg.rollout
    per_step = t.prompts_per_step * r.n
    per_mini = per_step // t.mini_batches
    per_worker = per_mini // t.num_workers
    max_len = r.max_prompt_len + r.max_response_len
    budget = cfg.actor.max_tokens_per_micro_batch
    # a sequence longer than the budget is a micro-batch of its own; shorter ones share
    micro = per_worker if max_len >= budget else min(per_worker, -(-per_worker * max_len // budget))
    return BatchSizes(
        prompts_per_step=t.prompts_per_step,
        n=r.n,
        sequences_per_step=per_step,
        mini_batches=t.mini_batches,
        sequences_per_mini_batch=per_mini,
        ppo_epochs=t.ppo_epochs,
        updates_per_step=t.mini_batches * t.ppo_epochs,
        num_workers=t.num_workers,
        sequences_per_worker=per_worker,
        max_seq_len=max_len,
        max_micro_batches_per_worker=micro,
        steps_per_epoch=num_tasks // t.prompts_per_step if num_tasks else None,
    )


def load_config(
    schema: type[T], path: str | os.PathLike[str] | None = None, overrides: Sequence[str] = ()
) -> T:
    """Build ``schema`` (a dataclass) from its defaults, then the YAML file ``path``, then
    ``key=value`` overrides (dotted keys: ``trainer.total_steps=10``), each overriding the last.
    Unknown keys, wrong types and failed checks raise :class:`ConfigError` naming the key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    layers = [OmegaConf.structured(schema)]
    if path is not None:
        if not Path(path).is_file():
            raise ConfigError(
                f"config file {str(path)!r} does not exist; pass a YAML file (an example: "
                f"{example_config('grpo_calc_tiny')})"
            )
        layers.append(_load_yaml(Path(path)))
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not key=value (e.g. trainer.total_steps=10)")
    try:
        layers.append(OmegaConf.from_dotlist(list(overrides)))
        merged = OmegaConf.merge(*layers)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        msg = str(getattr(exc, "msg", None) or exc).strip().splitlines()[0]
        raise ConfigError(
            f"config key {key}: {msg}{_known_keys(exc)}; fix it in the YAML file or the key=value "
            "override"
        ) from None


def _load_yaml(path: Path) -> Any:
    """The YAML file ``path`` as a mapping of sections; an empty file (no YAML document: blank,
    comments only) or one whose top level is not a mapping (a list, a scalar) is a
    ``ConfigError``, not a run of every default. An explicit ``{}`` is a choice: every value
    from the defaults and the overrides."""
    from omegaconf import DictConfig, OmegaConf

    try:
        loaded = OmegaConf.load(path)
    except Exception as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc}") from None
    example = f"(an example: {example_config('grpo_calc_tiny')})"
    if not isinstance(loaded, DictConfig):
        raise ConfigError(
            f"config file {str(path)!r}: its top level is a list; a config is a mapping of "
            f"sections (model:, data:, trainer:, ...) {example}"
        )
    if not loaded and _no_document(path):
        raise ConfigError(
            f"config file {str(path)!r} is empty; write the sections to change (model:, data:, "
            f"trainer:, ...) {example}, or pass the name of a shipped config"
        )
    return loaded


def _no_document(path: Path) -> bool:
    """No YAML document in ``path``: only blank lines, comments and ``---``/``...`` markers."""
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return all(line in ("", "---", "...") for line in lines)


def _known_keys(exc: Exception) -> str:
    """For an unknown key: the keys its section does have (read from the section's dataclass)."""
    from omegaconf.errors import ConfigKeyError

    section = getattr(exc, "object_type", None)
    if not isinstance(exc, ConfigKeyError) or not dataclasses.is_dataclass(section):
        return ""
    return f" (its keys: {', '.join(f.name for f in dataclasses.fields(section))})"


def example_config(name: str) -> Path:
    """Path of a YAML config shipped in ``agentloop/trainers/configs`` (e.g. ``grpo_calc_tiny``)."""
    return Path(__file__).resolve().parent / "configs" / f"{name}.yaml"


def check_engine_serves(cfg: TrainConfig, model_dir: Path) -> None:
    """Fail at start-up, naming the fix, when ``engine.backend: vllm`` cannot serve the model
    here (a vision-language model without torchvision: the CPU build of vLLM)."""
    from agentloop.engines.vllm_mm import start_failure_hint

    serves = cfg.engine.backend != "vllm" or cfg.rollout.replay is not None
    if not serves and (hint := start_failure_hint(model_dir)):
        raise ConfigError(
            f"vLLM cannot serve model.path={str(model_dir)!r} here{hint}; "
            "agentloop train runs it with engine.backend=hf"
        )


def local_model_dir(path: str) -> Path:
    """``model.path`` as the local model directory the trainers load (names are resolved above)."""
    if not Path(path).is_dir():
        raise ConfigError(
            f"model.path={path!r} is not a directory; pass a local HF model dir (a named model "
            "such as tiny or tiny-calc is built by agentloop train/sft/demo, or in Python by "
            "agentloop.models.resolve_model(cfg))"
        )
    return check_model_dir(path, "model.path").resolve()
