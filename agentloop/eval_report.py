"""Eval results: the summary of a run (``summary.json``), comparing two runs, printing both."""

from __future__ import annotations

import dataclasses
import math
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop.errors import ConfigError
from agentloop.io import iter_jsonl, read_json_object, trajectory_from_dict
from agentloop.stats import (
    BootstrapResult,
    Estimate,
    majority_vote,
    mean_ci,
    mean_pass_at_k,
    paired_bootstrap,
    pass_at_k_values,
)
from agentloop.types import StopReason, Trajectory

__all__ = [
    "CONFIG_FILE",
    "SUMMARY_FILE",
    "TRAJECTORIES_FILE",
    "Comparison",
    "EvalEpisode",
    "EvalSummary",
    "compare_runs",
    "group_episodes",
    "is_final_segment",
    "is_success",
    "pass_ci",
    "print_comparison",
    "print_summary",
    "read_episodes",
    "read_run",
    "record_is_success",
    "summarize",
]

#: The files of a run directory: one JSON line per episode (per segment of an episode written as
#: several, see :class:`EvalEpisode`), the run's settings, its summary.
TRAJECTORIES_FILE = "trajectories.jsonl"
CONFIG_FILE = "config.json"
SUMMARY_FILE = "summary.json"


# ---------------------------------------------------------------------- summary
@dataclass(frozen=True)
class EvalSummary:
    """What ``summary.json`` holds. Rates are per episode unless named per task; the reward CI is
    over per-task mean rewards (samples of one task are not independent). ``errors`` holds the
    first error text per failing stop reason; ``tokens_per_s`` counts sampled tokens over the
    time spent playing (engine start-up excluded), None when nothing was played."""

    env: str
    model: str
    split: str
    config_hash: str
    tasks: int
    episodes: int
    samples_per_task: int
    reward: Estimate
    pass_at_k: Mapping[int, float]
    majority_at_n: float | None
    answer_rate: float | None
    mean_turns: float
    tool_calls_per_episode: float
    tool_error_rate: float
    tool_errors: Mapping[str, float]
    stop_reasons: Mapping[str, int]
    errors: Mapping[str, str]
    mean_response_tokens: float
    tokens_per_s: float | None
    elapsed_s: float
    #: Episodes that ended normally but whose tool calls failed for their service (a tool
    #: exception or a timeout: a sandbox or search server that died mid-run), with an example.
    tool_failed: int = 0
    tool_failure: str | None = None
    #: Episodes whose math check ran past its deadline (scored wrong; ``grader_timeout``).
    grader_timeouts: int = 0

    @property
    def failed(self) -> int:
        """Episodes a service failed (``Trajectory.service_failed``): an error stop reason
        (engine, env, tool-fatal, timeout), or a tool call that failed for its service."""
        errors = sum(n for r, n in self.stop_reasons.items() if StopReason(r).is_error)
        return errors + self.tool_failed

    @property
    def failed_share(self) -> float:
        return self.failed / self.episodes if self.episodes else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["pass_at_k"] = {str(k): v for k, v in self.pass_at_k.items()}
        cleaned: dict[str, Any] = _nan_to_none(out)
        return cleaned

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalSummary:
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names}
        r: dict[str, Any] = {k: math.nan if v is None else v for k, v in data["reward"].items()}
        fields["reward"] = Estimate(**r)
        fields["pass_at_k"] = {int(k): v for k, v in data["pass_at_k"].items()}
        return cls(**fields)


def is_success(t: Trajectory, pass_threshold: float | None = None) -> bool:
    """Whether an episode counts as a success (pass@k): its reward is at least
    ``pass_threshold``; with ``None``, its verdict says the answer is right (an env that grades
    an answer), else its reward is at least 1."""
    if pass_threshold is None and t.verdict is not None:
        return t.verdict.correct
    return t.reward >= (1.0 if pass_threshold is None else pass_threshold)


def record_is_success(record: Mapping[str, Any]) -> bool:
    """:func:`is_success` (default threshold) of a stored trajectory record (:func:`read_run`)."""
    verdict = record.get("verdict")
    if verdict:
        return bool(verdict["correct"])
    return float(record["reward"]) >= 1.0


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    return value


def summarize(
    episodes: Sequence[EvalEpisode],
    *,
    env: str,
    model: str,
    split: str,
    samples_per_task: int,
    pass_threshold: float | None,
    config_hash: str,
    tokens_per_s: float | None = None,
    elapsed_s: float = 0.0,
) -> EvalSummary:
    """The summary of a run's episodes (:func:`read_episodes`). Their final records may hold
    ``answer_key``/``answer_correct`` extras where the env's answers are extractable
    (majority@n). Turns, tool calls and response tokens count every segment of an episode."""
    if not episodes:
        raise ConfigError("no trajectories to summarize; did the run play any episode?")
    played = [tuple(trajectory_from_dict(r) for r in e.segments) for e in episodes]
    finals = [segs[-1] for segs in played]  # reward, stop reason, error: the episode's
    records = [e.final for e in episodes]
    by_task: defaultdict[str, list[Trajectory]] = defaultdict(list)
    for t in finals:
        by_task[t.task_id].append(t)
    success = [(len(g), sum(is_success(t, pass_threshold) for t in g)) for g in by_task.values()]
    calls = sum(t.metrics.get("tool_calls", 0.0) for segs in played for t in segs)
    kinds = _tool_error_kinds(finals)
    has_answers = any("answer_key" in r for r in records)
    tool_failed = [segs for segs in played if segs[-1].service_failed and not segs[-1].failed]
    return EvalSummary(
        env=env,
        model=model,
        split=split,
        config_hash=config_hash,
        tasks=len(by_task),
        episodes=len(finals),
        samples_per_task=samples_per_task,
        reward=mean_ci([sum(t.reward for t in g) / len(g) for g in by_task.values()]),
        pass_at_k={k: mean_pass_at_k(success, k) for k in pass_at_k_values(samples_per_task)},
        majority_at_n=_majority(records) if has_answers else None,
        answer_rate=_mean([r.get("answer_key") is not None for r in records])
        if has_answers
        else None,
        mean_turns=_mean([sum(len(t.turns) for t in segs) for segs in played]),
        tool_calls_per_episode=calls / len(finals),
        tool_error_rate=sum(kinds.values()) / calls if calls else 0.0,
        tool_errors={k: v / calls for k, v in sorted(kinds.items())} if calls else {},
        stop_reasons=dict(Counter(t.stop_reason.value for t in finals).most_common()),
        errors=_first_errors(finals),
        mean_response_tokens=_mean([sum(len(t.response_ids) for t in segs) for segs in played]),
        tokens_per_s=tokens_per_s,
        elapsed_s=elapsed_s,
        tool_failed=len(tool_failed),
        tool_failure=_first_tool_failure([t for segs in tool_failed for t in segs]),
        grader_timeouts=int(sum(t.metrics.get("grader_timeout", 0.0) for t in finals)),
    )


def _tool_error_kinds(finals: Sequence[Trajectory]) -> Counter[str]:
    """The tool errors of the episodes by kind (env metrics: every segment carries the whole
    episode's, so only the final ones count)."""
    kinds: Counter[str] = Counter()
    for t in finals:
        kinds.update(
            {
                k.removeprefix("tool_error/"): v
                for k, v in t.metrics.items()
                if k.startswith("tool_error/")
            }
        )
    return kinds


def _first_tool_failure(trajs: Sequence[Trajectory]) -> str | None:
    """The dispatcher's words for the first failed tool call (a tool exception or a timeout)."""
    for t in trajs:
        for m in t.messages:
            if m.role == "tool" and str(m.content).startswith("Error: tool "):
                return str(m.content)[:500]
    return None


def _first_errors(trajs: Sequence[Trajectory]) -> dict[str, str]:
    """The first error text of each stop reason that carries one."""
    errors: dict[str, str] = {}
    for t in trajs:
        if t.error:
            errors.setdefault(t.stop_reason.value, t.error)
    return errors


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _majority(records: Sequence[Mapping[str, Any]]) -> float:
    """Share of tasks whose majority answer (ties: lowest sample index) is correct. A task with
    no extracted answer counts as wrong."""
    votes: defaultdict[str, list[str | None]] = defaultdict(list)
    right: dict[tuple[str, str], bool] = {}
    for r in sorted(records, key=lambda r: (r["task_id"], r["sample_index"])):
        key = r.get("answer_key")
        votes[r["task_id"]].append(key)
        if key is not None:
            right.setdefault((r["task_id"], key), bool(r.get("answer_correct")))
    winners = {task: majority_vote(keys) for task, keys in votes.items()}
    return _mean([w is not None and right[(task, w)] for task, w in winners.items()])


def is_final_segment(metrics: Mapping[str, float]) -> bool:
    """Whether a trajectory ends its episode: see :class:`EvalEpisode`."""
    return metrics.get("segment_index", 0.0) >= metrics.get("segments", 1.0) - 1


@dataclass(frozen=True)
class EvalEpisode:
    """One (task, sample) episode of a run: its trajectory records, in segment order.

    Usually one record. An episode is written as several segments (``segments``/
    ``segment_index`` metrics) when an agent run through the proxy (``agentloop.proxy``)
    rewrote its history, or under ``rollout.thinking=strip`` (one sample per turn). The final
    segment stands for the episode: its reward, stop reason, error, answer and env metrics
    (``tool_error/*``, which every segment carries whole) are the episode's; turns, tool calls
    and response tokens are each segment's own and add up over ``segments``.
    """

    segments: tuple[dict[str, Any], ...]

    @property
    def final(self) -> dict[str, Any]:
        """The record that stands for the episode (its last segment)."""
        return self.segments[-1]

    @property
    def key(self) -> tuple[str, int]:
        return self.final["task_id"], self.final["sample_index"]


def group_episodes(records: Iterable[dict[str, Any]]) -> list[EvalEpisode]:
    """Records in file order as episodes, in the order they were finished. An episode is the
    run of records of one (task, sample) from a ``segment_index`` 0 to the first final segment
    (:func:`is_final_segment`). An attempt that a killed run left without its final segment is
    dropped (the resumed run replayed the episode from scratch); later copies of a finished
    episode are ignored (the first stands)."""
    attempts: dict[tuple[str, int], list[dict[str, Any]]] = {}
    done: set[tuple[str, int]] = set()
    out = []
    for r in records:
        if (key := (r["task_id"], r["sample_index"])) in done:
            continue
        metrics = r.get("metrics") or {}
        if metrics.get("segment_index", 0.0) == 0.0 or key not in attempts:
            attempts[key] = []  # a fresh attempt: an unfinished earlier one is dropped
        attempts[key].append(r)
        if is_final_segment(metrics):
            done.add(key)
            out.append(EvalEpisode(tuple(attempts.pop(key))))
    return out


def read_episodes(run: str | os.PathLike[str]) -> list[EvalEpisode]:
    """The finished episodes of run directory ``run`` (:func:`group_episodes` of its
    trajectories file). A torn last line from a killed run is skipped."""
    path = Path(run) / TRAJECTORIES_FILE
    if not path.exists():
        raise ConfigError(f"{run} is not an eval run: {path} does not exist")
    return group_episodes(iter_jsonl(path, require=("task_id", "sample_index")))


def read_run(run: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """One record per finished episode of run directory ``run``: the one that stands for it
    (:attr:`EvalEpisode.final`), in the order they were finished."""
    return [e.final for e in read_episodes(run)]


# ---------------------------------------------------------------------- compare
@dataclass(frozen=True)
class Comparison:
    """Run B against run A on the tasks both evaluated: per-task mean reward differences (B - A)
    with a paired bootstrap, and whether the two runs' configs match."""

    a: str
    b: str
    hash_a: str | None
    hash_b: str | None
    differing_parts: tuple[str, ...]
    tasks_a: int
    tasks_b: int
    mean_a: float
    mean_b: float
    result: BootstrapResult
    verdict: str

    @property
    def same_config(self) -> bool:
        return self.hash_a is not None and self.hash_a == self.hash_b


def compare_runs(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    *,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    by: str = "reward",
) -> Comparison:
    """Compare eval runs ``a`` and ``b`` (run directories) on their common tasks: each task's
    mean reward (``by="reward"``) or its share of successes (``by="pass"``, :func:`is_success`:
    pass@1 per task, where a reward pays more than correctness)."""
    if by not in ("reward", "pass"):
        raise ConfigError(f"compare_runs(by={by!r}): compare by 'reward' or 'pass'")
    means_a, means_b = _task_means(Path(a), by), _task_means(Path(b), by)
    common = sorted(means_a.keys() & means_b.keys())
    if len(common) < 2:
        raise ConfigError(
            f"{a} and {b} share {len(common)} task(s); a paired comparison needs at least 2. "
            "Evaluate both on the same --env, --split and tasks"
        )
    diffs = [means_b[t] - means_a[t] for t in common]
    res = paired_bootstrap(diffs, n_resamples=n_resamples, seed=seed, confidence=confidence)
    cfg_a, cfg_b = _run_config(Path(a)), _run_config(Path(b))
    parts_a, parts_b = cfg_a.get("config_parts", {}), cfg_b.get("config_parts", {})
    differ = tuple(
        sorted(k for k in parts_a.keys() | parts_b.keys() if parts_a.get(k) != parts_b.get(k))
    )
    if res.lo > 0:
        verdict = f"B beats A (B - A = {res.mean_diff:+.4f}, {confidence:.0%} CI excludes 0)"
    elif res.hi < 0:
        verdict = f"A beats B (B - A = {res.mean_diff:+.4f}, {confidence:.0%} CI excludes 0)"
    else:
        verdict = f"no significant difference ({confidence:.0%} CI of B - A includes 0)"
    return Comparison(
        str(a),
        str(b),
        cfg_a.get("config_hash"),
        cfg_b.get("config_hash"),
        differ,
        len(means_a),
        len(means_b),
        _mean([means_a[t] for t in common]),
        _mean([means_b[t] for t in common]),
        res,
        verdict,
    )


def _task_means(run: Path, by: str = "reward") -> dict[str, float]:
    values: defaultdict[str, list[float]] = defaultdict(list)
    for r in read_run(run):
        values[r["task_id"]].append(
            float(r["reward"]) if by == "reward" else float(record_is_success(r))
        )
    return {t: sum(v) / len(v) for t, v in values.items()}


def pass_ci(run: str | os.PathLike[str]) -> Estimate:
    """Pass@1 of an eval run (:func:`is_success`, default threshold) with its 95% CI over tasks."""
    return mean_ci(list(_task_means(Path(run), "pass").values()))


def _run_config(run: Path) -> dict[str, Any]:
    path = run / CONFIG_FILE
    return read_json_object(path) if path.exists() else {}


# ---------------------------------------------------------------------- printing
def print_summary(summary: EvalSummary, console: Any = None) -> None:
    """The summary as a rich table."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    r = summary.reward
    table = Table(title=escape(f"eval: {summary.env} ({summary.split}) · {summary.model}"))
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("tasks × samples", f"{summary.tasks} × {summary.samples_per_task} = {summary.episodes}"),
        ("mean reward (95% CI)", f"{r.mean:.4f} [{r.lo:.4f}, {r.hi:.4f}]"),
        *((f"pass@{k}", f"{v:.4f}") for k, v in summary.pass_at_k.items()),
        ("majority@n", _fmt(summary.majority_at_n)),
        ("answer extracted", _fmt(summary.answer_rate)),
        ("mean turns", f"{summary.mean_turns:.2f}"),
        ("tool calls / episode", f"{summary.tool_calls_per_episode:.2f}"),
        ("tool error rate", f"{summary.tool_error_rate:.3f}"),
        *((f"  tool error: {k}", f"{v:.3f}") for k, v in summary.tool_errors.items()),
        ("stop reasons", ", ".join(f"{k} {v}" for k, v in summary.stop_reasons.items())),
        ("mean response tokens", f"{summary.mean_response_tokens:.1f}"),
        ("tokens/s (sampled)", _fmt(summary.tokens_per_s, ".1f")),
        ("config hash", summary.config_hash[:16]),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    for reason, error in summary.errors.items():
        count = summary.stop_reasons.get(reason, 0)
        style = "bold red" if StopReason(reason).is_error else "dim"
        console.print(f"[{style}]{count} episode(s) ended with {reason}, e.g.:[/] {escape(error)}")
    if summary.grader_timeouts:
        console.print(
            f"[yellow]{summary.grader_timeouts} answer(s) scored wrong because the math check "
            "ran past its deadline (grader_timeout_s)[/]"
        )
    if summary.tool_failed:
        console.print(
            f"[bold red]{summary.tool_failed} episode(s) had tool calls fail for their service, "
            f"e.g.:[/] {escape(summary.tool_failure or '')}"
        )


def print_comparison(c: Comparison, console: Any = None) -> None:
    """The comparison, with a loud warning when the configs differ."""
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    if not c.same_config:
        console.print(
            f"[bold red]WARNING: the runs are not comparable: config hash A {c.hash_a} != B "
            f"{c.hash_b} (differs in: {', '.join(c.differing_parts) or 'unknown'}). A difference "
            "below may come from the settings, not the model.[/]"
        )
    res = c.result
    console.print(escape(f"A = {c.a} ({c.tasks_a} tasks), B = {c.b} ({c.tasks_b} tasks)"))
    console.print(f"{res.n} tasks paired")
    console.print(f"mean reward A {c.mean_a:.4f}, B {c.mean_b:.4f}")
    console.print(
        f"B - A = {res.mean_diff:+.4f}, {res.confidence:.0%} CI [{res.lo:+.4f}, {res.hi:+.4f}], "
        f"p ≈ {res.p_value:.4f} (paired bootstrap, {res.n_resamples} resamples)"
    )
    console.print(f"[bold]verdict: {c.verdict}[/]")


def _fmt(value: float | None, spec: str = ".4f") -> str:
    return "n/a" if value is None or not math.isfinite(value) else format(value, spec)
