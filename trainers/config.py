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

from agentloop.engines.backends import BACKENDS, EngineBackend
from agentloop.engines.vllm import VLLMConfig, WeightTransport, check_settings
from agentloop.errors import ConfigError
from agentloop.model_files import check_model_dir
from agentloop.rollout import RolloutConfig
from agentloop.tools.mcp import parse_tool_spec
from agentloop.tools.recording import ToolTapeConfig
from agentloop.trainers.choices import ADV_ESTIMATORS, ESTIMATOR_SPECS, KL_KINDS
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
PLACEMENTS = ("local", "ray")
MODES = ("sync", "one_step", "async")
STALENESS_POLICIES = ("wait", "drop")
_RAY_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def _check(section: str, obj: Any, rules: Sequence[tuple[str, bool, str]]) -> None:
    """Raise for the first ``(field, ok, fix)`` rule that fails, naming the value and the fix."""
    for name, ok, fix in rules:
        if not ok:
            raise ConfigError(f"{section}.{name}={getattr(obj, name)!r}: {fix}")


@dataclass(frozen=True)
class ModelConfig:
    """The model a run starts from: the policy, and the frozen reference model when KL is used."""

    path: str = "tiny"
    """A local HF model directory (``config.json``, safetensors, tokenizer), or a model built
    here on first use and cached: ``tiny`` (the random tiny model: every Calc reward is 0),
    ``tiny-calc`` (the tiny model after the demo's cold-start SFT, which solves some Calc tasks)
    or ``tiny-vlm``. A name is resolved by the entry points (``agentloop.models``), not when the
    config is read. Nothing is downloaded from a hub."""


@dataclass(frozen=True)
class DataConfig:
    """Which env to play, and which of its task splits to train and validate on. The tasks
    come from ``env.tasks(split, limit)``."""

    env: str = "agentloop/Calc-v0"
    """Registered env id (``agentloop.envs.make``) that gives the tasks, tools and rewards."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the env's constructor (``make(env, **env_kwargs)``), the same for
    training and validation episodes."""
    tools: list[str] = field(default_factory=list)
    """Extra tools for the env (a ``ToolEnv``), as ``agentloop eval --tools`` takes them:
    ``mcp:COMMAND ARGS`` (an MCP server over stdio, a process per episode) or
    ``mcp:http://HOST:PORT/mcp`` (streamable HTTP); one named like an env tool is an error
    unless the spec says ``replace=NAME`` (``mcp[replace=python]:…``).
    Training and validation episodes get them; with ``rollout.tools_replay`` they are made from
    the recording's schemas, without the servers."""
    train_split: str = "train"
    """The env's task split that training samples prompts from."""
    num_train_tasks: int | None = None
    """At most this many tasks of ``train_split`` (>= 1); None: every task the env gives."""
    val_split: str = "test"
    """The env's task split that validation (``trainer.val_every``) plays."""
    num_val_tasks: int | None = 32
    """At most this many tasks of ``val_split`` per validation (>= 1); None: the whole split."""
    shuffle: bool = True
    """Visit the training tasks in a fresh order each epoch, seeded by ``trainer.seed`` and the
    epoch alone (a resumed run sees the same order); false: in the split's order."""
    train_files: str | None = None
    """A task file (JSONL, JSON or parquet; the project's rows or verl's) for ``train_split``:
    shorthand for ``env_kwargs.files.<train_split>`` of a file-backed env (MathTool-v0, ...)."""
    val_files: str | None = None
    """Likewise for ``val_split`` (``env_kwargs.files.<val_split>``)."""
    reward: str | None = None
    """Your own reward instead of the env's (a ``ToolEnv``): ``path/to/file.py:fn`` or
    ``package.module:fn``, verl's ``compute_score(data_source, solution_str, ground_truth,
    extra_info)`` or agentloop's ``fn(task, messages)``; also used by validation."""

    def __post_init__(self) -> None:
        _check(
            "data",
            self,
            [
                (
                    name,
                    getattr(self, name) is None or getattr(self, name) >= 1,
                    "must be >= 1, or null",
                )
                for name in ("num_train_tasks", "num_val_tasks")
            ],
        )
        for i, spec in enumerate(self.tools):
            try:
                parse_tool_spec(spec)
            except ConfigError as exc:
                raise ConfigError(f"data.tools[{i}]={spec!r}: {exc}") from None
        where, sep, name = (self.reward or "").rpartition(":")
        if self.reward is not None and not (sep and where and name.isidentifier()):
            raise ConfigError(
                f"data.reward={self.reward!r}: give 'path/to/file.py:function' or "
                "'package.module:function'"
            )  # the function itself is loaded when the run starts, named if missing

    def env_args(self) -> dict[str, Any]:
        """``env_kwargs`` with ``train_files``/``val_files`` added to its ``files``."""
        given = {self.train_split: self.train_files, self.val_split: self.val_files}
        added = {split: path for split, path in given.items() if path is not None}
        if not added:
            return dict(self.env_kwargs)
        return {**self.env_kwargs, "files": {**self.env_kwargs.get("files", {}), **added}}


@dataclass(frozen=True)
class TrainRolloutConfig(RolloutConfig):
    """The ``rollout`` section: :class:`~agentloop.rollout.RolloutConfig` (the episode limits
    and sampling, shared with validation and eval) plus the training side's fields below."""

    n: int = 8
    """Samples per prompt: the GRPO group whose rewards the advantages compare (>= 1;
    ``algorithm.dynamic_sampling`` needs >= 2)."""
    concurrency: int = 64
    """Episodes in flight at once while collecting a batch (>= 1); validation uses it too."""
    loop_workers: int = 1
    """Processes the rollout loop runs in (>= 1): above 1, a batch's episodes are spread over
    that many worker processes (started once per run), the engine staying in the driver
    (:mod:`agentloop.loop_workers`); for when the loop's own Python, not the engine, bounds
    generation. Validation plays in the driver. Without ``tools_record``/``tools_replay``."""
    save_trajectories: bool = True
    """Write each step's batch to ``trainer.out_dir``/``trajectories/step_NNNNNN.jsonl``
    (eval-format JSONL, one line per trajectory), which ``replay`` can train from."""
    replay: str | None = None
    """A run's ``trajectories/`` directory: step N trains on its saved ``step_NNNNNN.jsonl``
    instead of generating (no engine is started; needs ``trainer.mode=sync`` and at most as
    many ``trainer.total_steps`` as were recorded). None: generate."""
    tools_record: str | None = None
    """Record every tool call of the run (training and validation episodes) to this
    directory's ``tool_calls.jsonl`` (see ``agentloop.tools.recording``). None: no recording."""
    tools_replay: str | None = None
    """Serve tool outputs from a recording (``tools_record`` of an earlier run) instead of
    running the tools, so a trainer bug can be bisected with identical tool outputs."""
    tools_replay_miss: str = "error"
    """A replayed call that is not in the recording: ``error`` (an error observation),
    ``fail`` (the episode stops; the run fails at the end) or ``live`` (the tool runs)."""
    tools_replay_latency: str = "zero"
    """Replayed calls take no time (``zero``) or their recorded time (``recorded``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.tool_io().check_loop_workers(self.loop_workers, "rollout.loop_workers")
        _check(
            "rollout",
            self,
            [
                ("n", self.n >= 1, "must be >= 1 (samples per prompt)"),
                ("concurrency", self.concurrency >= 1, "must be >= 1"),
                (
                    "replay",
                    self.replay is None or Path(self.replay).is_dir(),
                    "is not a directory; pass a run's trajectories/ dir (step_NNNNNN.jsonl files)",
                ),
            ],
        )

    def tool_io(self) -> ToolTapeConfig:
        """The tool record/replay settings as the tools layer takes them."""
        return ToolTapeConfig.of(
            self.tools_record, self.tools_replay, self.tools_replay_miss, self.tools_replay_latency
        )

    def base(self) -> RolloutConfig:
        """The plain :class:`RolloutConfig` the rollout loop takes."""
        names = [f.name for f in dataclasses.fields(RolloutConfig)]
        return RolloutConfig(**{n: getattr(self, n) for n in names})


@dataclass(frozen=True)
class AlgorithmConfig:
    """Advantages (verl's names and formulas), KL as a reward penalty, DAPO dynamic sampling
    and overlong reward shaping. KL as a *loss* term is ``actor.kl_coef``/``actor.kl_type``."""

    adv_estimator: str = "grpo"
    """``grpo``: ``(R - group mean) / (group std + epsilon)``; ``rloo``: ``R`` minus the mean
    of the group's other samples; ``reinforce_plus_plus``: the discounted return (``gamma``),
    whitened over every loss token of the batch; ``turn_rloo``: per-turn credit from each
    turn's reward — the discounted return from that turn on (``gamma`` per turn) minus the
    mean of the group's other episodes at the same turn position (unbiased when turn counts
    vary; ``trainers/turn_advantages.py``), divided by their std with ``norm_by_std``."""
    norm_by_std: bool = True
    """``grpo``: divide by the group's reward std; false: ``R - group mean`` (Dr.GRPO)."""
    epsilon: float = 1e-6
    """Added to the group std before dividing (``grpo``), so a constant group gives 0; > 0."""
    gamma: float = 1.0
    """Discount per loss token of ``reinforce_plus_plus``'s return, in (0, 1]; 1: none."""
    use_kl_in_reward: bool = False
    """Subtract ``kl_reward_coef · KL(policy ‖ reference)`` from each loss token's reward
    before the advantages (verl's ``use_kl_in_reward``); loads the reference model."""
    kl_reward_coef: float = 0.001
    """Weight of the KL reward penalty (>= 0); used with ``use_kl_in_reward`` only."""
    kl_reward_type: str = "kl"
    """KL estimator of the reward penalty: ``kl``/``k1``, ``abs``, ``mse``/``k2`` or
    ``low_var_kl``/``k3`` (verl's kinds)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose samples all score the same ``filter_metric``
    (no gradient signal) and generate more until ``trainer.prompts_per_step`` groups remain;
    needs ``rollout.n`` >= 2."""
    filter_metric: str = "reward"
    """What dynamic sampling compares within a group: ``reward``, or a trajectory metric the
    env reports, such as ``correct``."""
    max_sampling_rounds: int = 10
    """Dynamic sampling fails the step after this many generation rounds without enough
    groups (async: drops more than this × ``trainer.prompts_per_step`` groups for one batch);
    0: no cap."""
    overlong_buffer: int = 0
    """DAPO overlong shaping: a response longer than ``rollout.max_response_len -
    overlong_buffer`` tokens loses reward linearly, up to ``overlong_penalty_factor`` at the
    full length. Tokens, at most ``rollout.max_response_len`` (about a quarter of it); 0: off."""
    overlong_penalty_factor: float = 1.0
    """The largest overlong penalty, reached at ``rollout.max_response_len`` (>= 0)."""

    def __post_init__(self) -> None:
        _check(
            "algorithm",
            self,
            [
                (
                    "adv_estimator",
                    self.adv_estimator in ADV_ESTIMATORS,
                    f"must be one of {ADV_ESTIMATORS}",
                ),
                ("kl_reward_type", self.kl_reward_type in KL_KINDS, f"must be one of {KL_KINDS}"),
                ("gamma", 0 < self.gamma <= 1, "must be in (0, 1]"),
                ("epsilon", self.epsilon > 0, "must be > 0, e.g. 1e-6"),
                ("kl_reward_coef", self.kl_reward_coef >= 0, "must be >= 0"),
                ("max_sampling_rounds", self.max_sampling_rounds >= 0, "must be >= 0 (0 = no cap)"),
                ("overlong_buffer", self.overlong_buffer >= 0, "must be >= 0 (0 = off)"),
                ("overlong_penalty_factor", self.overlong_penalty_factor >= 0, "must be >= 0"),
            ],
        )


@dataclass(frozen=True)
class TrainerConfig:
    """The step structure, where the workers run, and how generation overlaps training.

    One step: ``prompts_per_step`` prompts × ``rollout.n`` samples, split into ``mini_batches``
    optimiser updates, repeated ``ppo_epochs`` times. The policy version is the number of steps
    trained; every sampled token records the version that sampled it, and the ``mode`` (see
    ``trainers/rollouts.py``) sets how far behind the trainer that version may be."""

    total_steps: int = 100
    """Training steps of the run (>= 1); a resumed run continues up to this step."""
    prompts_per_step: int = 32
    """Prompts (GRPO groups) per step (>= 1): a multiple of ``mini_batches``; one step trains
    on ``prompts_per_step × rollout.n`` sequences."""
    mini_batches: int = 1
    """Optimiser updates per pass over a step's batch (>= 1); each holds whole groups."""
    ppo_epochs: int = 1
    """Passes over a step's batch (>= 1); updates per step = ``mini_batches × ppo_epochs``."""
    val_every: int = 0
    """Validate every N steps and after the last one (verl's ``test_freq``); 0: never."""
    val_before_train: bool = False
    """Validate once before the first step as well (a fresh run only, not a resumed one)."""
    val_n: int = 1
    """Samples per validation task (>= 1)."""
    placement: str = "local"
    """``local``: one process, no Ray; ``ray``: ``num_workers`` FSDP2 worker actors (with
    their engines) in one Ray placement group, see the ``ray`` section."""
    num_workers: int = 1
    """Data-parallel FSDP2 trainer workers (>= 1; more than 1 needs ``placement=ray``); each
    mini-batch's sequences must split evenly across them."""
    seed: int = 0
    """Seeds the task order, the sampling seeds of every episode and, unless ``engine.seed``
    is set, the engines."""
    out_dir: str = "runs/grpo"
    """Run directory: ``config.yaml``, ``metrics.jsonl``, ``tb/``, ``trajectories/``,
    ``val/``, ``checkpoints/`` and the exported ``final/`` model."""
    sleep_engines: bool = True
    """``mode=sync``: free the colocated engines' memory while the trainer computes (vLLM
    sleep level 2: weights and KV cache dropped, the step's weight sync reloads them) and wake
    them for the next generation; the async modes never sleep them."""
    mode: str = "sync"
    """``sync``: generate a step's batch, train on it, push the weights; ``one_step``:
    generate step t+1's batch while step t trains; ``async``: a rollout side streams finished
    groups into a buffer the trainer takes batches from. Non-sync modes need ``actor.tis_cap``."""
    max_staleness: int = 1
    """How many policy versions older than the trainer a trained token may be (>= 0; async: at
    most ``(max_staleness + 1) × prompts_per_step`` groups are started and not yet trained)."""
    staleness_policy: str = "wait"
    """``wait``: hand groups to the trainer in the order they started (none can exceed
    ``max_staleness``); ``drop``: in the order they finish, dropping (and counting) any older
    than the bound."""
    push_every: int = 1
    """Push the weights to the engines every K steps (>= 1; K > 1 only with ``mode=async``,
    where ``max_staleness`` must be at least K - 1)."""
    partial_rollouts: bool = True
    """A weight push interrupts running generations and resumes them on the new weights;
    false: a push waits for them to finish."""
    batch_timeout_s: float = 3600.0
    """Deadline in seconds for the trainer's wait for one batch (> 0); past it the run fails."""
    rollout_workers: int = 0
    """N > 0 (``placement=ray``): run the engines in N separate rollout actors
    (disaggregated), the weights pushed from trainer rank 0 over a collective group (gloo on
    CPU, NCCL on GPU); 0: an engine colocated with every trainer worker."""
    max_failed_steps: int = 3
    """Stop the run with an error after this many steps whose rollouts all failed, with no step
    between them where they worked: error stop reasons or ``tool_exception``/``timeout`` tool
    errors (a dead sandbox, search service or engine) and no tool call that gave a result;
    0: never stop."""
    tool_error_warn_rise: float = 0.25
    """Warn when a step's tool-error rate is this much above the run's mean so far (0 to 1;
    e.g. a sandbox server going down); 0: never warn."""
    stop_without_tool_calls: int = 0
    """Stop the run with an error after this many consecutive steps in which no episode
    called a tool (``rollout/tool_episode_frac`` 0: the policy stopped using its tools, and
    training would go on single-turn); only for envs with tools. 0: off."""

    def __post_init__(self) -> None:
        positive = (
            "total_steps",
            "prompts_per_step",
            "mini_batches",
            "ppo_epochs",
            "val_n",
            "num_workers",
            "push_every",
        )
        _check(
            "trainer",
            self,
            [
                *((name, getattr(self, name) >= 1, "must be >= 1") for name in positive),
                ("val_every", self.val_every >= 0, "must be >= 0 (0 = never)"),
                ("stop_without_tool_calls", self.stop_without_tool_calls >= 0, "must be >= 0"),
                ("placement", self.placement in PLACEMENTS, f"must be one of {PLACEMENTS}"),
                ("mode", self.mode in MODES, f"must be one of {MODES}"),
                ("max_staleness", self.max_staleness >= 0, "must be >= 0 (policy versions)"),
                (
                    "staleness_policy",
                    self.staleness_policy in STALENESS_POLICIES,
                    f"must be one of {STALENESS_POLICIES}",
                ),
                ("batch_timeout_s", self.batch_timeout_s > 0, "must be > 0 (seconds)"),
                (
                    "rollout_workers",
                    self.rollout_workers >= 0,
                    "must be >= 0 (0: engines colocated with the trainer workers)",
                ),
                ("max_failed_steps", self.max_failed_steps >= 0, "must be >= 0 (0: never stop)"),
                (
                    "tool_error_warn_rise",
                    0.0 <= self.tool_error_warn_rise <= 1.0,
                    "must be in [0, 1] (0: never warn)",
                ),
            ],
        )


@dataclass(frozen=True)
class RayConfig:
    """Where ``trainer.placement=ray`` runs: one placement group with a bundle per trainer
    worker, then one per rollout worker (``trainer.rollout_workers``)."""

    address: str | None = None
    """``auto`` or ``HOST:PORT``: join a running Ray cluster (multi-node); None: start a
    private local Ray."""
    num_cpus: int | None = None
    """CPUs of the private local Ray (``address`` None); None: all of the machine's."""
    cpus_per_worker: float = 1.0
    """CPUs in each trainer worker's bundle (> 0)."""
    gpus_per_worker: float | None = None
    """GPUs in each trainer worker's bundle (>= 0); None: 1 when the cluster has GPUs, else 0."""
    placement_strategy: str = "PACK"
    """Ray placement group strategy: ``PACK``, ``SPREAD``, ``STRICT_PACK`` or
    ``STRICT_SPREAD``."""
    cpus_per_rollout_worker: float = 1.0
    """CPUs in each rollout worker's bundle (> 0)."""
    gpus_per_rollout_worker: float | None = None
    """GPUs in each rollout worker's bundle (>= 0); None: 1 when the cluster has GPUs, else 0."""
    weight_push_timeout_s: float = 300.0
    """Seconds a weight push to the rollout workers may take (> 0); past it the push fails
    and a dead rollout worker is restarted."""
    restart_timeout_s: float = 600.0
    """Seconds a dead rollout worker has to serve again (> 0) before the run stops."""

    def __post_init__(self) -> None:
        _check(
            "ray",
            self,
            [
                ("cpus_per_worker", self.cpus_per_worker > 0, "must be > 0"),
                ("cpus_per_rollout_worker", self.cpus_per_rollout_worker > 0, "must be > 0"),
                (
                    "gpus_per_rollout_worker",
                    self.gpus_per_rollout_worker is None or self.gpus_per_rollout_worker >= 0,
                    "must be >= 0, or null for auto",
                ),
                ("weight_push_timeout_s", self.weight_push_timeout_s > 0, "must be > 0 (seconds)"),
                ("restart_timeout_s", self.restart_timeout_s > 0, "must be > 0 (seconds)"),
                (
                    "gpus_per_worker",
                    self.gpus_per_worker is None or self.gpus_per_worker >= 0,
                    "must be >= 0, or null for auto",
                ),
                (
                    "placement_strategy",
                    self.placement_strategy in _RAY_STRATEGIES,
                    f"must be one of {_RAY_STRATEGIES}",
                ),
            ],
        )


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints under ``trainer.out_dir``/``checkpoints/`` (sharded model and optimiser
    state, the step, an RL run's data position), where a run resumes from, and the final export."""

    every: int = 0
    """Save every N steps (>= 0); 0: only at the end, with ``save_final``."""
    keep_last: int = 2
    """Checkpoints kept (>= 1); older ones are deleted."""
    resume: str = "auto"
    """``auto``: continue from the run dir's latest checkpoint, if any; ``never``: start
    fresh; or the path of a ``step_*`` checkpoint directory."""
    save_final: bool = True
    """Save a checkpoint after the last step."""
    export_final: bool = True
    """After the last step, write the model as a plain HF model dir (``final/`` for GRPO,
    ``model/`` for SFT, under ``trainer.out_dir``) for ``agentloop eval`` and vLLM."""
    allow_unverified: bool = False
    """Load a checkpoint that has no ``checksums.json`` (one copied without it, or written by
    an agentloop older than checksums) unverified, with a warning. Off: it is refused
    (``resume=auto`` falls back to an older verified checkpoint)."""

    def __post_init__(self) -> None:
        _check(
            "checkpoint",
            self,
            [
                ("every", self.every >= 0, "must be >= 0 (0 = at the end)"),
                ("keep_last", self.keep_last >= 1, "must be >= 1"),
                (
                    "resume",
                    self.resume in ("auto", "never") or Path(self.resume).is_dir(),
                    "must be 'auto', 'never' or an existing step_* directory",
                ),
            ],
        )


@dataclass(frozen=True)
class LoggingConfig:
    """Metric sinks. ``metrics.jsonl`` in ``trainer.out_dir`` is always written; the others
    are switched here."""

    console: bool = True
    """Print a compact line of each step's metrics."""
    progress: bool = True
    """Show a progress bar of the steps (on stderr)."""
    tensorboard: bool = True
    """Write TensorBoard events to ``trainer.out_dir``/``tb/``."""
    wandb: bool = False
    """Log to Weights & Biases (needs the ``wandb`` package: a run asked to log there without
    it fails at start-up rather than losing the metrics silently)."""
    wandb_project: str = "agentloop"
    """W&B project name."""
    run_name: str | None = None
    """W&B run name; None: W&B picks one."""

    def check_available(self) -> None:
        """Raise if a requested sink's package is missing (before a run starts any work)."""
        import importlib.util

        if self.wandb and importlib.util.find_spec("wandb") is None:
            raise ConfigError(
                "logging.wandb=true but the wandb package is not installed; pip install wandb, "
                "or set logging.wandb=false (metrics.jsonl and TensorBoard are still written)"
            )


@dataclass(frozen=True)
class EngineConfig:
    """The ``engine`` section: the settings of each vLLM engine replica, :class:`VLLMConfig`
    without ``model`` (the run's ``model.path``) and with VLLMConfig's defaults. Other
    ``AsyncEngineArgs`` go in ``engine_args``. On a GPU the engine shares the device with the
    trainer: lower ``gpu_memory_utilization`` (e.g. 0.4) to leave room."""

    backend: EngineBackend = "vllm"
    """``vllm``, or ``hf``: transformers' ``generate``, one request at a time, for a model or
    platform vLLM cannot serve (a vision-language model on a CPU); it takes ``dtype`` and
    ``weight_sync_timeout_s`` and no other setting of this section."""
    dtype: str = VLLMConfig.dtype
    """Weight dtype of the engine (``auto``: the model's; ``float32`` for exact CPU runs)."""
    max_model_len: int | None = None
    """Longest sequence an engine holds; None: ``rollout.max_prompt_len + max_response_len``."""
    max_num_seqs: int = VLLMConfig.max_num_seqs
    """Sequences an engine schedules at once."""
    seed: int | None = None
    """The engine's sampling seed; None: ``trainer.seed``."""
    kv_cache_memory_bytes: int | None = VLLMConfig.kv_cache_memory_bytes
    """KV cache size in bytes; None: ``gpu_memory_utilization`` on a GPU, 1 GiB on a CPU."""
    gpu_memory_utilization: float = VLLMConfig.gpu_memory_utilization
    """Share of the GPU's memory the engine may take, in (0, 1]."""
    tensor_parallel_size: int = VLLMConfig.tensor_parallel_size
    """GPUs one engine replica spans."""
    enforce_eager: bool | None = VLLMConfig.enforce_eager
    """Run the model eagerly, no torch.compile or CUDA graphs (faster start, slower decode on a
    GPU); None: eager on a CPU, compiled on a GPU."""
    enable_prefix_caching: bool = VLLMConfig.enable_prefix_caching
    """Reuse the KV cache of shared prefixes (the earlier turns of an episode)."""
    enable_sleep_mode: bool | None = VLLMConfig.enable_sleep_mode
    """Free the engine's GPU memory while the trainer runs; None: where the platform can."""
    weight_transport: WeightTransport = VLLMConfig.weight_transport
    """How weight updates reach the engine: ``auto``, ``file``, ``bytes`` or ``cuda_ipc``."""
    shm_dir: str = VLLMConfig.shm_dir
    """Directory of the ``file`` transport's weight file (shared memory)."""
    shutdown_timeout_s: float = VLLMConfig.shutdown_timeout_s
    """Seconds an engine may take to shut down before it is killed."""
    weight_sync_timeout_s: float = VLLMConfig.weight_sync_timeout_s
    """Seconds a weight reload may take before it fails."""
    weight_chunk_bytes: int = VLLMConfig.weight_chunk_bytes
    """Weight syncs load in chunks of about this many bytes, cut between transformer blocks:
    their extra GPU memory is about two chunks, whatever the model's size."""
    engine_args: dict[str, Any] = field(default_factory=dict)
    """Further ``vllm.AsyncEngineArgs``, passed verbatim (e.g. ``{block_size: 32}``)."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"engine.backend={self.backend!r} is not one of {BACKENDS}")
        check_settings(self, "engine")


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
        return settings


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
    """The YAML file ``path`` as a mapping of sections; an empty file or one whose top level
    is not a mapping (a list, a scalar) is a ``ConfigError``, not a run of every default."""
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
    if not loaded:
        raise ConfigError(
            f"config file {str(path)!r} is empty; write the sections to change (model:, data:, "
            f"trainer:, ...) {example}, or pass the name of a shipped config"
        )
    return loaded


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
