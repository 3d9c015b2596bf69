"""The ``model``, ``data``, ``rollout`` and ``algorithm`` sections of a training run's config."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentloop.errors import ConfigError
from agentloop.rollout import RolloutConfig
from agentloop.tools.mcp import parse_tool_spec
from agentloop.tools.recording import ToolTapeConfig
from agentloop.trainers.choices import ADV_ESTIMATORS, KL_KINDS

__all__ = ["AlgorithmConfig", "DataConfig", "ModelConfig", "TrainRolloutConfig", "check_fields"]


def check_fields(section: str, obj: Any, rules: Sequence[tuple[str, bool, str]]) -> None:
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
    """Registered env id (``agentloop.envs.make``) that gives the tasks, tools and rewards, or
    another framework's env played unchanged: ``skyrl_gym:ENV_CLASS``, ``aviary:NAME``."""
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
        check_fields(
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
        check_fields(
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
        check_fields(
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
