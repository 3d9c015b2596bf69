"""The demo's last stage: compare the SFT and RL eval runs, plot, write the viewer, report."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentloop.eval_report import (
    SUMMARY_FILE,
    EvalSummary,
    compare_runs,
    pass_ci,
    print_comparison,
    read_run,
    record_is_success,
)
from agentloop.trainers.metrics import read_metrics

if TYPE_CHECKING:
    from agentloop.models.demo import DemoConfigs, DemoResult
    from agentloop.trainers.sft import SFTResult

__all__ = [
    "RESULT_FILE",
    "eval_dirs",
    "finish",
    "plot_curves",
    "tool_call_rate",
    "tool_use_of_correct",
]

#: The demo's numbers, as JSON, in ``demo.out_dir`` (README numbers and the CI test read it).
RESULT_FILE = "demo_result.json"


def eval_dirs(configs: DemoConfigs[Any]) -> tuple[Path, Path]:
    """The eval runs of the SFT checkpoint (validation before step 1) and of the RL checkpoint
    (validation after the last step) inside the GRPO run directory."""
    val = Path(configs.grpo.trainer.out_dir) / "val"
    return val / "step_000000", val / f"step_{configs.grpo.trainer.total_steps:06d}"


def _summary(run: Path) -> EvalSummary:
    return EvalSummary.from_dict(json.loads((run / SUMMARY_FILE).read_text()))


def tool_use_of_correct(run: Path) -> float:
    """Share of the run's correct episodes that called the tool (NaN if none was correct)."""
    correct = [r for r in read_run(run) if record_is_success(r)]
    if not correct:
        return float("nan")
    return sum(1 for r in correct if r["metrics"].get("used_tool", 0.0) > 0) / len(correct)


def tool_call_rate(run: Path) -> float:
    """Share of the run's episodes that called the tool at least once."""
    records = read_run(run)
    used = sum(1 for r in records if r["metrics"].get("used_tool", 0.0) > 0)
    return used / len(records) if records else float("nan")


def plot_curves(metrics: Mapping[int, Mapping[str, float]], out: Path, title: str) -> Path:
    """Training reward per step (mean over the step's episodes) and held-out pass@1 with its 95%
    CI at each validation, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    steps = sorted(s for s, m in metrics.items() if "rollout/reward_mean" in m)
    val = sorted(s for s, m in metrics.items() if "val/pass@1" in m)
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=120)
    ax.plot(
        steps,
        [metrics[s]["rollout/reward_mean"] for s in steps],
        color="#8fb3d9",
        marker=".",
        label="training reward (mean of the step's rollouts)",
    )
    if val:
        ys = [metrics[s]["val/pass@1"] for s in val]
        lo = [metrics[s].get("val/pass_lo", y) for s, y in zip(val, ys, strict=True)]
        hi = [metrics[s].get("val/pass_hi", y) for s, y in zip(val, ys, strict=True)]
        err = [
            [y - a for y, a in zip(ys, lo, strict=True)],
            [b - y for y, b in zip(ys, hi, strict=True)],
        ]
        ax.errorbar(
            val,
            ys,
            yerr=err,
            color="#c0392b",
            marker="o",
            capsize=4,
            linewidth=2,
            label="held-out pass@1 (95% CI over tasks)",
        )
    ax.set_xlabel("GRPO step (0 = the SFT checkpoint)")
    ax.set_ylabel("reward / pass@1")
    rewards = [metrics[s]["rollout/reward_mean"] for s in steps]
    # pass@1 is in [0, 1]; a reward may reach past it (DeepEyes' tool bonus: up to 2)
    ax.set_ylim(min(0.0, *rewards), max(1.0, *rewards))
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def _val_metrics(configs: DemoConfigs[Any]) -> dict[int, dict[str, float]]:
    """The run's metrics, with each validation's reward CI read from its summary."""
    out_dir = Path(configs.grpo.trainer.out_dir)
    metrics = {s: dict(m) for s, m in read_metrics(out_dir).items()}
    for step, m in metrics.items():
        summary_path = out_dir / "val" / f"step_{step:06d}" / SUMMARY_FILE
        if "val/pass@1" in m and summary_path.is_file():
            ci = pass_ci(summary_path.parent)  # pass@1's: a reward may pay more than that
            m["val/pass_lo"], m["val/pass_hi"] = ci.lo, ci.hi
    return metrics


def finish(
    configs: DemoConfigs[Any],
    sft: SFTResult,
    seconds: dict[str, float],
    started: float,
    console: Any,
    *,
    cold_start_cached: bool = False,
) -> DemoResult:
    """Compare, plot, view, and print the final report; write ``demo_result.json``.
    ``cold_start_cached``: GRPO started from the cached cold start (``sft`` is its record)."""
    from agentloop.models.demo import DemoResult
    from agentloop.viewer import write_view

    out = Path(configs.demo.out_dir)
    sft_eval, rl_eval = eval_dirs(configs)
    comparison = compare_runs(sft_eval, rl_eval, by="pass")  # the CI of the pass@1 gain
    print_comparison(comparison, console)
    res = comparison.result
    a, b = _summary(sft_eval).pass_at_k[1], _summary(rl_eval).pass_at_k[1]
    gain = b - a
    curve = plot_curves(
        _val_metrics(configs),
        out / "curve.png",
        f"{configs.family.title}: held-out pass@1 {a:.2f} (SFT) -> {b:.2f} (RL), "
        f"gain {gain:+.2f} [{res.lo:+.2f}, {res.hi:+.2f}]",
    )
    view = write_view(rl_eval, out / "view.html")
    seconds["report"] = 0.0
    seconds["total"] = time.perf_counter() - started
    passed = gain >= configs.demo.min_gain and res.lo > 0
    result = DemoResult(
        out,
        sft_eval,
        rl_eval,
        a,
        b,
        gain,
        (res.lo, res.hi),
        res.p_value,
        passed,
        curve,
        view,
        sft,
        dict(seconds),
        cold_start_cached,
    )
    record = _record(configs, result, res.n)
    (out / RESULT_FILE).write_text(json.dumps(record, indent=2, default=str))
    _print_report(console, configs, result, record)
    return result


def logprob_gap(configs: DemoConfigs[Any]) -> float:
    """The worst training step's mean |engine − trainer| logprob of the sampled tokens: the
    trainer re-scores each episode (its images too) with the weights the engine sampled with,
    so anything lost on the way (an image, a placeholder run, a sync) shows as whole nats."""
    steps = read_metrics(Path(configs.grpo.trainer.out_dir)).values()
    gaps = [m["actor/rollout_abs_diff"] for m in steps if "actor/rollout_abs_diff" in m]
    return max(gaps) if gaps else float("nan")


def _record(configs: DemoConfigs[Any], result: DemoResult, tasks: int) -> dict[str, Any]:
    """``demo_result.json``: the result, the tool-use rates, the engine-vs-trainer logprob
    gap and the machine's load."""
    return {
        "family": configs.family.name,
        **dataclasses.asdict(result),  # the SFT run's record nested under "sft"; paths as str
        "tool_use_of_correct": tool_use_of_correct(result.rl_eval),
        "tool_use_of_correct_sft": tool_use_of_correct(result.sft_eval),
        "tool_call_rate_sft": tool_call_rate(result.sft_eval),
        "tool_call_rate_rl": tool_call_rate(result.rl_eval),
        "logprob_gap_max": logprob_gap(configs),
        "tasks": tasks,
        "samples_per_task": configs.grpo.trainer.val_n,
        "load_avg": os.getloadavg(),
        "cpus": os.cpu_count(),
    }


def _print_report(
    console: Any, configs: DemoConfigs[Any], r: DemoResult, record: Mapping[str, Any]
) -> None:
    from rich.table import Table

    table = Table(title=f"{configs.family.title} demo: what RL did", show_header=False)
    table.add_column(justify="left")
    table.add_column(justify="right")
    n = f"{record['tasks']} held-out tasks × {record['samples_per_task']} samples, T=" + str(
        configs.grpo.rollout.temperature
    )
    verdict = "[bold green]PASS[/]" if r.passed else "[bold red]FAIL[/]"
    rows = [
        ("pass@1, SFT checkpoint (GRPO step 0)", f"{r.pass_at_1_sft:.3f}"),
        (
            f"pass@1, RL checkpoint (step {configs.grpo.trainer.total_steps})",
            f"{r.pass_at_1_rl:.3f}",
        ),
        ("gain, paired bootstrap 95% CI", f"{r.gain:+.3f} [{r.ci[0]:+.3f}, {r.ci[1]:+.3f}]"),
        ("p-value", f"{r.p_value:.4f}"),
        (f"gain >= {configs.demo.min_gain:.2f} and CI above 0", verdict),
        (
            f"episodes that called {configs.family.tool}, SFT -> RL",
            f"{record['tool_call_rate_sft']:.0%} -> {record['tool_call_rate_rl']:.0%}",
        ),
        (
            f"correct answers that used the {configs.family.tool} tool, SFT -> RL",
            f"{record['tool_use_of_correct_sft']:.0%} -> {record['tool_use_of_correct']:.0%}",
        ),
        ("engine vs trainer |Δlogprob|, worst step", f"{record['logprob_gap_max']:.1e}"),
        (
            "cold start",
            f"{r.sft.steps} SFT steps, "
            + (f"cached ({configs.family.model_name})" if r.cold_start_cached else "this run"),
        ),
        ("evaluated on", n),
        *((f"time: {k}", f"{v:.0f} s") for k, v in r.seconds.items() if k != "report"),
        (
            "machine",
            f"{record['cpus']} CPUs, load average "
            + " / ".join(f"{x:.1f}" for x in record["load_avg"]),
        ),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(f"curve:   {r.curve_png}")
    console.print(f"viewer:  {r.viewer_html}  (open in a browser; works offline)")
    console.print(f"runs:    SFT eval {r.sft_eval}, RL eval {r.rl_eval}")
    console.print(f"         agentloop eval --compare {r.sft_eval} {r.rl_eval}")
    console.print(f"numbers: {r.out_dir / RESULT_FILE}")
