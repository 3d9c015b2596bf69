"""Step metrics: rollout statistics, engine-vs-trainer mismatch, phase timers, and the sinks."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agentloop.trainers.config import LoggingConfig
from agentloop.types import StopReason, TrajectoryGroup, Turn

__all__ = [
    "METRICS_FILE",
    "MetricsLogger",
    "PhaseTimer",
    "format_step_line",
    "mismatch_metrics",
    "read_metrics",
    "rollout_metrics",
]

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
# (label, key, format) of the one-line console summary
_LINE = (
    ("reward", "rollout/reward_mean", ".3f"),
    ("acc", "rollout/acc", ".3f"),
    ("len", "rollout/response_len_mean", ".1f"),
    ("turns", "rollout/turns_mean", ".2f"),
    ("tools", "rollout/tool_calls_mean", ".2f"),
    ("kl", "actor/kl", ".2e"),
    ("ent", "actor/entropy", ".3f"),
    ("clip", "actor/clipfrac", ".3f"),
    ("gnorm", "actor/grad_norm", ".3f"),
    ("Δlp", "mismatch/abs_diff_mean", ".1e"),
    ("gen", "timing_s/gen", ".1f"),
    ("upd", "timing_s/update_actor", ".1f"),
    ("sync", "timing_s/sync_weights", ".2f"),
    ("tok/s", "perf/tokens_per_s", ".0f"),
    ("val", "val/reward_mean", ".3f"),
)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def rollout_metrics(groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
    """``rollout/*``: reward, accuracy (the ``correct``/``acc`` reward metric, where the env
    reports one), response length, turns, tool calls and errors, the share of episodes that
    called a tool at all, the mean reward per turn position, stop reasons;
    ``reward/grader_timeouts`` and ``reward/grader_errors`` (math grading: episodes whose check
    ran past its deadline or failed, scored wrong) where the env reports them."""
    trajs = [t for g in groups for t in g.trajectories]
    if not trajs:
        return {"rollout/episodes": 0.0}
    rewards = [t.reward for t in trajs]
    lengths = [float(len(t.response_ids)) for t in trajs]
    calls = [t.metrics.get("tool_calls", 0.0) for t in trajs]
    errors = [t.metrics.get("tool_errors", 0.0) for t in trajs]
    mean_r = _mean(rewards)
    out = {
        # a proxied agent's episode may be several segments (rows): count its first only
        "rollout/episodes": float(sum(not t.metrics.get("segment_index") for t in trajs)),
        "rollout/groups": float(len(groups)),
        "rollout/reward_mean": mean_r,
        "rollout/reward_std": math.sqrt(_mean([(r - mean_r) ** 2 for r in rewards])),
        "rollout/reward_max": max(rewards),
        "rollout/reward_min": min(rewards),
        "rollout/response_len_mean": _mean(lengths),
        "rollout/response_len_max": max(lengths),
        "rollout/trained_tokens_mean": _mean([float(t.num_trained_tokens) for t in trajs]),
        # per episode: a strip episode's samples (or a proxied agent's segments) are one
        "rollout/turns_mean": _mean([float(len(turns)) for turns in _episode_turns(groups)]),
        "rollout/tool_calls_mean": _mean(calls),
        "rollout/tool_errors_mean": _mean(errors),
        "rollout/tool_error_rate": sum(errors) / sum(calls) if sum(calls) else 0.0,
        "rollout/max_tokens_frac": _mean(
            [float(t.stop_reason == StopReason.MAX_TOKENS) for t in trajs]
        ),
        "rollout/failed_frac": _mean([float(t.failed) for t in trajs]),
    }
    for key in ("correct", "acc"):
        if any(key in t.metrics for t in trajs):  # an episode cut off before scoring counts as 0
            out["rollout/acc"] = _mean([float(t.metrics.get(key, 0.0)) for t in trajs])
            break
    firsts = [t for t in trajs if "segments" in t.metrics and not t.metrics["segment_index"]]
    if firsts:  # proxied agents: an episode of n segments rewrote its history n - 1 times
        out["rollout/segments_mean"] = _mean([t.metrics["segments"] for t in firsts])
    out["rollout/tool_episode_frac"] = _mean([float(c > 0) for c in calls])
    out.update(_turn_position_rewards(_episode_turns(groups)))
    for key in ("grader_timeout", "grader_error"):  # math rewards: checks cut at their deadline
        if any(key in t.metrics for t in trajs):
            firsts_only = (t for t in trajs if not t.metrics.get("segment_index"))  # per episode
            out[f"reward/{key}s"] = sum(t.metrics.get(key, 0.0) for t in firsts_only)
    if any("overlong_penalty" in t.metrics for t in trajs):
        out["rollout/overlong_penalty_mean"] = _mean(
            [t.metrics.get("overlong_penalty", 0.0) for t in trajs]
        )
    return out


_MAX_TURN_POSITIONS = 16  # keys per step stay bounded on very long episodes


def _episode_turns(groups: Sequence[TrajectoryGroup]) -> list[list[Turn]]:
    """Each episode's turns, in order: the trajectories of one ``sample_index`` in a group (one,
    or a ``rollout.thinking=strip`` episode's samples, a proxied agent's segments) are one."""
    episodes: dict[tuple[int, int], list[Turn]] = {}
    for g, group in enumerate(groups):
        for t in group.trajectories:
            episodes.setdefault((g, t.sample_index), []).extend(t.turns)
    return list(episodes.values())


def _turn_position_rewards(episodes: Sequence[Sequence[Turn]]) -> dict[str, float]:
    """``rollout/turn_reward/k``: mean reward of turn ``k`` over the episodes that reached it."""
    by_k: dict[int, list[float]] = {}
    for turns in episodes:
        for k, turn in enumerate(turns[:_MAX_TURN_POSITIONS]):
            by_k.setdefault(k, []).append(turn.reward)
    return {f"rollout/turn_reward/{k}": _mean(v) for k, v in sorted(by_k.items())}


def mismatch_metrics(
    engine_logprobs: Sequence[torch.Tensor],
    trainer_logprobs: Sequence[torch.Tensor],
    masks: Sequence[torch.Tensor],
    *,
    tis_cap: float | None = None,
) -> dict[str, float]:
    """``mismatch/*``: how far the engine's sampling logprobs are from the trainer's logprobs of
    the same tokens under the same weights (mean and max ``|Δ|``), and the truncated importance
    weights ``exp(trainer − engine)`` that TIS would apply (mean, max, fraction above the cap).
    Over loss tokens only. With the weights synced exactly and the same dtype this is ~1e-6."""
    m = torch.cat([x.float() for x in masks]) > 0
    if not bool(m.any()):
        return {}
    engine = torch.cat([x.float() for x in engine_logprobs])[m]
    trainer = torch.cat([x.float() for x in trainer_logprobs])[m]
    diff = (trainer - engine).abs()
    weight = torch.exp(trainer - engine)
    out = {
        "mismatch/abs_diff_mean": float(diff.mean()),
        "mismatch/abs_diff_max": float(diff.max()),
        "mismatch/tis_weight_mean": float(weight.mean()),
        "mismatch/tis_weight_max": float(weight.max()),
    }
    if tis_cap is not None:
        out["mismatch/tis_capped_frac"] = float((weight > tis_cap).float().mean())
    return out


class PhaseTimer:
    """Wall-clock seconds per named phase of one step, as ``timing_s/<phase>`` (verl's names)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        out = {f"timing_s/{k}": v for k, v in self.seconds.items()}
        out["timing_s/step"] = time.perf_counter() - self._start
        return out


def format_step_line(step: int, total: int, metrics: Mapping[str, float]) -> str:
    """The compact console line of one step (only the metrics it has)."""
    parts = [f"step {step}/{total}"]
    for label, key, spec in _LINE:
        if key in metrics and math.isfinite(metrics[key]):
            parts.append(f"{label} {metrics[key]:{spec}}")
    return " | ".join(parts)


def read_metrics(out_dir: str | Path) -> dict[int, dict[str, float]]:
    """Step → metrics from a run's ``metrics.jsonl`` (a step logged twice, as after a resume,
    keeps its last record)."""
    from agentloop.io import iter_jsonl

    path = Path(out_dir) / METRICS_FILE
    if not path.is_file():
        return {}
    return {int(r["step"]): r for r in iter_jsonl(path, require=("step",))}


class MetricsLogger:
    """Sends each step's metrics to the console, ``metrics.jsonl``, TensorBoard and W&B.

    ``start_step`` is the last step already done (a resumed run): the progress bar starts
    there and TensorBoard drops events logged after it by the interrupted run.
    """

    def __init__(
        self,
        cfg: LoggingConfig,
        out_dir: Path,
        *,
        total_steps: int,
        start_step: int = 0,
        run_config: Mapping[str, Any] | None = None,
    ) -> None:
        from tqdm import tqdm

        self.cfg, self.out_dir, self.total = cfg, out_dir, total_steps
        self._jsonl = (out_dir / METRICS_FILE).open("a", encoding="utf-8")
        self._bar = tqdm(
            total=total_steps,
            initial=start_step,
            desc="train",
            unit="step",
            file=sys.stderr,
            disable=not cfg.progress,
            dynamic_ncols=True,
        )
        self._tb: Any = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(out_dir / "tb"), purge_step=start_step + 1)
        self._wandb: Any = None
        if cfg.wandb:
            cfg.check_available()
            import wandb

            self._wandb = wandb.init(
                project=cfg.wandb_project,
                name=cfg.run_name,
                dir=str(out_dir),
                config=dict(run_config or {}),
                resume="allow",
            )

    def log(self, step: int, metrics: Mapping[str, float], *, advance: bool = True) -> None:
        """Record ``metrics`` of ``step``; ``advance`` moves the progress bar (not for a
        validation before the first step)."""
        clean = {k: float(v) for k, v in metrics.items()}
        record = {"step": step, "time": time.time(), **clean}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for key, value in clean.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(clean, step=step)
        if self.cfg.console:
            line = format_step_line(step, self.total, clean)
            if self._bar.disable:
                print(line, flush=True)
            else:
                self._bar.write(line, file=sys.stderr)
        if advance:
            self._bar.update(1)

    def close(self) -> None:
        self._bar.close()
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
