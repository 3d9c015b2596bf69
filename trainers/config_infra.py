"""The ``trainer``, ``ray``, ``checkpoint``, ``logging`` and ``engine`` sections of a run config."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentloop.engines.backends import BACKENDS, EngineBackend
from agentloop.engines.vllm_config import VLLMConfig, WeightTransport, check_settings
from agentloop.errors import ConfigError
from agentloop.trainers.config_data import check_fields

__all__ = ["CheckpointConfig", "EngineConfig", "LoggingConfig", "RayConfig", "TrainerConfig"]

PLACEMENTS = ("local", "ray")
MODES = ("sync", "one_step", "async")
STALENESS_POLICIES = ("wait", "drop")
_RAY_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


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
        check_fields(
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
        check_fields(
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
        check_fields(
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
    lora_rank: int | None = None
    """The engines' LoRA adapter slot. None: ``actor.lora.rank`` for vLLM engines colocated
    with the trainer (each sync sends the adapter alone, reloaded in place), else 0; 0: no
    slot, a LoRA policy's sync sends the merged full weights."""
    engine_args: dict[str, Any] = field(default_factory=dict)
    """Further ``vllm.AsyncEngineArgs``, passed verbatim (e.g. ``{block_size: 32}``)."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"engine.backend={self.backend!r} is not one of {BACKENDS}")
        check_settings(self, "engine")
