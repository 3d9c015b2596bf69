"""The race's records: each system's per-step phases read from its own logs, the merged results
JSON, and the markdown table (per system and step, then agentloop ÷ best peer per phase)."""

from __future__ import annotations

import ast
import json
import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

PHASES = ("gen", "old_logprobs", "update", "sync")
TRL_TAG = "RACE_TRL_STEP "  # the line prefix bench/peers/trl_grpo.py prints one step's phases with
_VERL_LINE = re.compile(r"^(?:\([^)]*\)\s*)?step:(\d+) - (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours its workers' log prefixes, into a file too
# printed by bench/peers/verl_race_loop.py (multi variant): observation tokens in each response
VERL_UNSAMPLED_TAG = "RACE_VERL_UNSAMPLED "
_VERL_UNSAMPLED = re.compile(VERL_UNSAMPLED_TAG + r"(\d+)")


@dataclass(frozen=True)
class Step:
    """One training step of one system: seconds per phase (``other`` is the rest of ``wall``),
    the tokens it sampled, and the system's own peak-memory figure when it logs one."""

    step: int
    wall: float
    gen: float
    old_logprobs: float
    update: float
    sync: float
    sampled_tokens: float
    peak_mem_gb: float | None = None

    @property
    def other(self) -> float:
        return self.wall - self.gen - self.old_logprobs - self.update - self.sync

    @property
    def tokens_per_s(self) -> float:
        return self.sampled_tokens / self.wall if self.wall > 0 else 0.0


@dataclass(frozen=True)
class SystemRun:
    """One system's run: its steps, the versions that ran, exit code, wall time, and the peak
    GPU memory nvidia-smi saw while it ran (all processes)."""

    system: str
    steps: tuple[Step, ...]
    versions: dict[str, str] = field(default_factory=dict)
    rc: int | None = None
    wall_s: float = 0.0
    peak_gpu_mem_gb: float | None = None
    error: str | None = None

    def timed(self, warmup: int = 1) -> list[Step]:
        return [s for s in self.steps if s.step > warmup]


def parse_agentloop(metrics_jsonl: str, sequences: int) -> list[Step]:
    """agentloop's ``metrics.jsonl`` (one JSON object per step, verl's ``timing_s/`` names)."""
    out = []
    for line in metrics_jsonl.splitlines():
        if not line.strip():
            continue
        m = json.loads(line)
        if "timing_s/step" not in m:
            continue
        out.append(
            Step(
                step=int(m["step"]),
                wall=m["timing_s/step"],
                gen=m.get("timing_s/gen", 0.0),
                old_logprobs=m.get("timing_s/old_log_prob", 0.0),
                update=m.get("timing_s/update_actor", 0.0),
                sync=m.get("timing_s/sync_weights", 0.0),
                sampled_tokens=m.get("perf/sampled_tokens", 0.0),
            )
        )
    return out


_NP_SCALAR = re.compile(r"^np\.\w+\((.*)\)$")  # numpy 2's repr: np.float64(1.5)


def _verl_value(text: str) -> Any:
    text = text.strip()
    if hit := _NP_SCALAR.match(text):
        text = hit.group(1)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None


def verl_metrics(log: str) -> list[dict[str, Any]]:
    """The metric dicts of verl's console logger lines (``step:N - key:value - ...``)."""
    out = []
    for line in log.splitlines():
        hit = _VERL_LINE.match(_ANSI.sub("", line).strip())
        if not hit:
            continue
        metrics: dict[str, Any] = {"step": int(hit.group(1))}
        for item in hit.group(2).split(" - "):
            key, sep, value = item.rpartition(":")
            if sep and key:
                metrics[key.strip()] = _verl_value(value)
        out.append(metrics)
    return out


def parse_verl(log: str, sequences: int) -> list[Step]:
    """verl's per-step timers: ``timing_s/gen`` (rollout, and putting the replicas to sleep),
    ``old_log_prob``, ``update_actor``, ``update_weights`` (waking vLLM and the weight push).
    Sampled tokens: its ``response_length/mean`` less the observation tokens of a response
    where the race's agent loop says how many (``RACE_VERL_UNSAMPLED n``; multi variant)."""
    hit = _VERL_UNSAMPLED.search(log)
    unsampled = float(hit.group(1)) if hit else 0.0
    out = []
    for m in verl_metrics(log):
        if "timing_s/step" not in m:
            continue
        mem = m.get("perf/max_memory_allocated_gb")
        out.append(
            Step(
                step=m["step"],
                wall=m["timing_s/step"],
                gen=m.get("timing_s/gen", 0.0),
                old_logprobs=m.get("timing_s/old_log_prob", 0.0),
                update=m.get("timing_s/update_actor", 0.0),
                sync=m.get("timing_s/update_weights", 0.0),
                sampled_tokens=(m.get("response_length/mean", 0.0) - unsampled) * sequences,
                peak_mem_gb=float(mem) if mem is not None else None,
            )
        )
    return out


def parse_trl(log: str, sequences: int) -> list[Step]:
    """The step lines of ``trl_grpo.py``: TRL's own ``profiling_context`` timers (vLLM.generate,
    sync_weights, _get_per_token_logps_and_entropies, compute_loss) summed per optimizer step."""
    out = []
    for line in log.splitlines():
        at = line.find(TRL_TAG)  # a progress bar on stderr may sit before it, on the same line
        if at < 0:
            continue
        m = json.loads(line[at + len(TRL_TAG) :])
        out.append(
            Step(
                step=int(m["step"]),
                wall=m["wall"],
                gen=m["gen"],
                old_logprobs=m["old_logprobs"],
                update=m["update"],
                sync=m["sync"],
                sampled_tokens=m["mean_completion_len"] * sequences,
                peak_mem_gb=m.get("peak_mem_gb"),
            )
        )
    return out


PARSERS = {"agentloop": parse_agentloop, "trl": parse_trl, "verl": parse_verl}


def run_to_json(run: SystemRun) -> dict[str, Any]:
    d = asdict(run)
    d["steps"] = [dict(asdict(s), other=s.other, tokens_per_s=s.tokens_per_s) for s in run.steps]
    return d


def run_from_json(d: dict[str, Any]) -> SystemRun:
    keys = Step.__dataclass_fields__
    steps = tuple(Step(**{k: v for k, v in s.items() if k in keys}) for s in d["steps"])
    return SystemRun(**{**d, "steps": steps})


def median_phases(run: SystemRun) -> dict[str, float]:
    """Median over the timed steps of wall, each phase, other and tokens/s."""
    timed = run.timed()
    if not timed:
        return {}
    cols = ("wall", *PHASES, "other", "tokens_per_s")
    return {c: statistics.median(float(getattr(s, c)) for s in timed) for c in cols}


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "–" if x is None else format(x, fmt)


def table(runs: list[SystemRun], machine: str) -> str:
    """The markdown report: every step of every system, then the medians and the ratios."""
    head = (
        "| system | step | wall s | gen s | old logprobs s | update s | sync s | other s "
        "| sampled tok/s | peak GPU mem GB |"
    )
    lines = [f"GRPO step race on {machine}", "", head, "|" + "---|" * 10]
    for run in runs:
        if not run.steps:
            lines.append(f"| {run.system} | – | failed (rc {run.rc}): {run.error or 'no steps'} |")
        for s in run.steps:
            label = f"{s.step} (warm-up)" if s.step == 1 else str(s.step)
            mem = s.peak_mem_gb if s.peak_mem_gb is not None else run.peak_gpu_mem_gb
            lines.append(
                f"| {run.system} | {label} | {s.wall:.2f} | {s.gen:.2f} | {s.old_logprobs:.2f} | "
                f"{s.update:.2f} | {s.sync:.3f} | {s.other:.2f} | {s.tokens_per_s:,.0f} | "
                f"{_f(mem, '.1f')} |"
            )
    lines += ["", "Median of the timed steps (after the warm-up); ratio = agentloop ÷ best peer "
              "(time: below 1 is agentloop faster; tok/s: above 1 is).", ""]  # fmt: skip
    cols = ("wall", *PHASES, "other", "tokens_per_s")
    lines += ["| system | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    med = {r.system: median_phases(r) for r in runs if median_phases(r)}
    for name, m in med.items():
        lines.append(f"| {name} | " + " | ".join(_f(m[c]) for c in cols) + " |")
    ratios = ratio_row(med)
    if ratios:
        lines.append(
            "| agentloop ÷ best peer | " + " | ".join(_f(ratios.get(c)) for c in cols) + " |"
        )
    return "\n".join(lines) + "\n"


def ratio_row(med: dict[str, dict[str, float]]) -> dict[str, float]:
    """agentloop's median ÷ the best peer's, per column (best: least time, most tokens/s)."""
    ours = med.get("agentloop")
    peers = [m for name, m in med.items() if name != "agentloop"]
    if not ours or not peers:
        return {}
    out = {}
    for col, value in ours.items():
        pick = max if col == "tokens_per_s" else min
        best = pick(p[col] for p in peers)
        if best > 0:
            out[col] = value / best
    return out
