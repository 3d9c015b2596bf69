"""Race agentloop's GRPO step against TRL's and verl's on one GPU, one system after another.

    python3 bench/peers/race.py --out DIR                       # agentloop, trl, verl
    python3 bench/peers/race.py --out DIR --systems agentloop,trl --variant single --shape 0.5b
    python3 bench/peers/race.py --out DIR --variant multi       # 3 turns, 64-token observations
    python3 bench/peers/race.py --out DIR --merge               # only merge the runs kept in --work

Run it on the GPU machine after ``source bench/gpu/setup.sh`` (agentloop, vLLM) and
``bash bench/peers/install.sh`` (each peer in its own ``/tmp/peer-NAME`` dir, put first on the
``PYTHONPATH`` of that peer's process only). Each system runs in its own process
(``bench/peers/NAME_grpo.py``) through its own entry point, on the same random-init model dir
(``workload.py``); its per-step phases come from its own logs (``results.py``). The runs are kept
under ``--work`` (``/root/race``: it survives between commands on a warm machine), so a race
split over several commands merges into one ``results-VARIANT.json`` and ``table-VARIANT.md``
under ``--out``, with the last lines of each system's log.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from results import PARSERS, SystemRun, run_from_json, run_to_json, table  # noqa: E402
from workload import SHAPES, VARIANTS, Workload  # noqa: E402

SYSTEMS = ("agentloop", "trl", "verl")
VERSIONED = {
    "agentloop": ("torch", "vllm", "transformers", "tokenizers", "safetensors"),
    "trl": ("trl", "torch", "vllm", "transformers", "tokenizers", "accelerate", "datasets"),
    "verl": ("verl", "torch", "vllm", "transformers", "tokenizers", "ray", "tensordict",
             "transferqueue", "hydra-core", "omegaconf"),
}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="where the results JSON and table go")
    p.add_argument("--work", type=Path, default=Path("/root/race"), help="the runs, kept")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    p.add_argument("--variant", default="single", choices=VARIANTS)
    p.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    p.add_argument("--steps", type=int, default=5, help="steps per system, the first a warm-up")
    p.add_argument(
        "--tokenizer",
        type=Path,
        default=ROOT / ".gpu-stage" / "race-tokenizer",
        help="tokenizer dir (stage.sh pads the tiny one: .gpu-stage/race-tokenizer)",
    )
    p.add_argument("--models", type=Path, default=Path("/root/models"))
    p.add_argument("--timeout", type=float, default=540.0, help="seconds per system")
    p.add_argument("--merge", action="store_true", help="run nothing; merge the kept runs")
    args = p.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown:
        p.error(f"--systems: unknown {unknown}; choose from {','.join(SYSTEMS)}")
    try:
        Workload(shape=args.shape, variant=args.variant, steps=args.steps)  # its checks
    except ValueError as exc:
        p.error(str(exc))
    return args


def peer_env(system: str) -> dict[str, str]:
    """This system's environment: a peer's own install dir first on its PYTHONPATH."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # agentloop's env module (race_env.py) must import in every process the trainer starts
    first = str(HERE) if system == "agentloop" else os.environ.get(
        f"PEER_{system.upper()}_SITE", f"/tmp/peer-{system}")  # fmt: skip
    env["PYTHONPATH"] = first + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def versions(system: str, env: dict[str, str]) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys\nout = {}\n"
            "for d in sys.argv[1:]:\n    try: out[d] = m.version(d)\n"
            "    except m.PackageNotFoundError: out[d] = 'missing'\n"
            "print(json.dumps(out))")  # fmt: skip
    res = subprocess.run([sys.executable, "-c", code, *VERSIONED[system]], env=env, cwd="/tmp",
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    out: dict[str, str] = (
        json.loads(res.stdout) if res.returncode == 0 else {"error": res.stderr[-300:]}
    )
    out["python"] = sys.version.split()[0]
    return out


class MemorySampler(threading.Thread):
    """The GPU's peak used memory (all processes) while a system runs, from nvidia-smi."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_mib = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            used = smi("memory.used")
            if used:
                self.peak_mib = max(self.peak_mib, float(used.splitlines()[0]))


def smi(query: str) -> str:
    try:
        cmd = ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"]
        res = subprocess.run(cmd,
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return res.stdout.strip() if res.returncode == 0 else ""


def run_system(system: str, args: argparse.Namespace, model: Path) -> SystemRun:
    """One system's run, in its own process; its result is kept in the work dir."""
    w = Workload(shape=args.shape, variant=args.variant, steps=args.steps)
    out = args.work / args.variant / system
    out.mkdir(parents=True, exist_ok=True)
    env = peer_env(system)
    cmd = [sys.executable, str(HERE / f"{system}_grpo.py"), "--model", str(model), "--out",
           str(out), "--variant", args.variant, "--shape", args.shape,
           "--steps", str(args.steps)]  # fmt: skip
    sampler, t0, rc, error = MemorySampler(), time.perf_counter(), None, None
    sampler.start()
    with open(out / "run.log", "w") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd="/tmp",
                                timeout=args.timeout).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            error = f"timed out after {args.timeout:.0f} s"
    sampler.stop.set()
    wall = time.perf_counter() - t0
    source = out / "run" / "metrics.jsonl" if system == "agentloop" else out / "run.log"
    text = source.read_text(errors="replace") if source.is_file() else ""
    steps = PARSERS[system](text, w.sequences)
    if rc not in (0, None) and error is None:
        error = f"exit status {rc}"
    run = SystemRun(system=system, steps=tuple(steps), versions=versions(system, env), rc=rc,
                    wall_s=round(wall, 1),
                    peak_gpu_mem_gb=round(sampler.peak_mib / 1024, 2) or None,
                    error=error)  # fmt: skip
    (out / "result.json").write_text(json.dumps(run_to_json(run), indent=2))
    print(json.dumps({"system": system, "rc": rc, "wall_s": run.wall_s, "steps": len(steps),
                      "error": error}), flush=True)  # fmt: skip
    return run


def merge(args: argparse.Namespace) -> Path:
    """Every kept run of this variant into ``results-VARIANT.json`` and ``table-VARIANT.md``."""
    runs = []
    for system in SYSTEMS:
        f = args.work / args.variant / system / "result.json"
        if f.is_file():
            runs.append(run_from_json(json.loads(f.read_text())))
    gpu = smi("name,memory.total,driver_version") or "unknown GPU"
    w = Workload(shape=args.shape, variant=args.variant, steps=args.steps)
    results = {"machine": gpu, "created_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
               "workload": {**w.__dict__, "sequences": w.sequences, "turns": w.turns,
                            "turn_tokens": w.turn_tokens, "sampled_tokens": w.sampled_tokens,
                            "max_response": w.max_response},
               "git": git_head(), "systems": {r.system: run_to_json(r) for r in runs}}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"results-{args.variant}.json"
    path.write_text(json.dumps(results, indent=2))
    md = table(runs, f"{gpu.split(',')[0]}, {describe(w)}")
    (args.out / f"table-{args.variant}.md").write_text(md)
    for r in runs:  # the tail of each log comes back too
        log = args.work / args.variant / r.system / "run.log"
        if log.is_file():
            lines = log.read_text(errors="replace").splitlines()[-300:]
            (args.out / f"{r.system}-{args.variant}.log").write_text("\n".join(lines) + "\n")
    print(md, flush=True)
    return path


def describe(w: Workload) -> str:
    """The variant in words, for the table's title."""
    if w.turns == 1:
        return f"single turn: {w.turn_tokens} sampled tokens an episode"
    return (f"{w.variant}: {w.turns} turns of {w.turn_tokens} sampled tokens, a fixed "
            f"{w.tool_tokens}-token user message between turns")  # fmt: skip


def git_head() -> str:
    res = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                         text=True)  # fmt: skip
    return res.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.merge:
        model = args.models / f"race-qwen2-{args.shape}"
        subprocess.run([sys.executable, str(HERE / "workload.py"), "--tokenizer",
                        str(args.tokenizer), "--out", str(model), "--shape", args.shape],
                       check=True, cwd="/tmp")  # fmt: skip
        for system in args.systems:
            run_system(system, args, model)
    merge(args)


if __name__ == "__main__":
    main()
