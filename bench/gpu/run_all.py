"""All GPU benchmarks in one command, each next to the ceiling measured in the same run.

    python bench/gpu/run_all.py --out $OUT                    # every phase
    python bench/gpu/run_all.py --out $OUT --phases ceilings weight_sync
    python bench/gpu/run_all.py --out $OUT --gpus 4           # every phase, four at a time
    python bench/gpu/run_all.py --report DIR [DIR ...]         # merge phase JSONs, print the table
    python bench/gpu/run_all.py --report DIR --baseline bench/gpu/results/h100-2026-11-23.json

Each phase runs in its own process (a clean GPU, and one failure does not stop the rest) and
writes ``<phase>.json`` and ``<phase>.log`` under ``--out``. ``--gpus N`` runs N phases side by
side, each alone on its own GPU of the host (``CUDA_VISIBLE_DEVICES``), in the listed order as
GPUs free up; the ``models`` phase (the random-init model dirs the others load) runs first,
alone. The report reads every ``<phase>.json`` it finds, prints one table (metric, ours,
ceiling, ratio) and writes ``results.json``. Run it on the GPU machine after
``source bench/gpu/setup.sh``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TOKENIZER = ROOT / ".gpu-stage" / "tiny-qwen2"
MODELS = Path("/root/models")


def phase_commands(out: Path) -> dict[str, list[str]]:
    py = sys.executable
    return {
        # the model dirs weight_sync and the GRPO phases load, made once (reused when present)
        "models": [py, str(HERE / "models.py"), "--tokenizer", str(TOKENIZER),
                   "--models", str(MODELS)],
        "ceilings": [py, str(HERE / "ceilings.py"), "--out", str(out / "ceilings.json")],
        "weight_sync": [py, str(HERE / "weight_sync.py"), "--tokenizer", str(TOKENIZER),
                        "--models", str(MODELS),
                        "--out", str(out / "weight_sync.json")],
        "train": [py, str(ROOT / "bench" / "train_throughput.py"), "--device", "cuda",
                  "--model-size", "0.5B", "--out", str(out / "train.json")],
        # 1.5B without activation checkpointing runs out of memory on 80 GB (16k-token batches)
        "train_1.5B": [py, str(ROOT / "bench" / "train_throughput.py"), "--device", "cuda",
                       "--model-size", "1.5B", "--activation-checkpointing", "on",
                       "--out", str(out / "train_1.5B.json")],
        "train_3B": [py, str(ROOT / "bench" / "train_throughput.py"), "--device", "cuda",
                     "--model-size", "3B", "--activation-checkpointing", "on", "--modes", "packed",
                     "--out", str(out / "train_3B.json")],
        # The agent loop vs one plain batched generate of the same tokens and vs its own turns
        # replayed through vLLM alone (the fair ceiling), on the tool-calling tiny model (the
        # python tool in-process), CUDA graphs on.
        **{f"rollout_{n}": [py, str(ROOT / "bench" / "rollout_throughput.py"), "--tasks",
                            str(n // 4), "--n", "4", "--repeat", "3", "--sandbox", "fake",
                            "--compile", "--dtype", "bfloat16",
                            "--out", str(out / f"rollout_{n}.json")] for n in (256, 1024)},
        # The same with the loop's episodes in 8 worker processes (agentloop.loop_workers)
        **{f"rollout_{n}_workers": [py, str(ROOT / "bench" / "rollout_throughput.py"), "--tasks",
                                    str(n // 4), "--n", "4", "--repeat", "3", "--sandbox", "fake",
                                    "--compile", "--dtype", "bfloat16", "--loop-workers", "8",
                                    "--out", str(out / f"rollout_{n}_workers.json")]
           for n in (256, 1024)},
        # The loop's turns/s in one process, over N loop workers, and N independent processes
        "loop_workers": [py, str(ROOT / "bench" / "loop_workers_bench.py"), "--episodes", "8000",
                         "--workers", "1", "2", "4", "8", "15", "--repeat", "3",
                         "--out", str(out / "loop_workers.json")],
        # One GRPO step (+1 to warm up) of the real trainer, colocated on the one GPU: a random-init
        # 0.5B model (weight_sync made it), Calc-v0, 64 prompts × 8 samples, up to 1k tokens each.
        "grpo_step": grpo_command(out / "grpo", "trainer.total_steps=2"),
        # The same shape for 3 steps in each overlapped mode (step 2 is recorded: steady).
        **{f"grpo_{mode}": grpo_command(out / f"grpo_{mode}", "trainer.total_steps=3",
                                        f"trainer.mode={mode}", "actor.tis_cap=2.0")
           for mode in ("one_step", "async")},
        # run from /tmp: `python -m pytest` puts its cwd first on sys.path, and the repo root's
        # agentloop/ folder would shadow the package (whose sub-packages live in sibling folders)
        "tests": [py, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                  "--continue-on-collection-errors", "--rootdir", str(ROOT),
                  "-c", str(ROOT / "pyproject.toml"),
                  f"--junitxml={out / 'tests.xml'}", str(ROOT / "tests")],
    }  # fmt: skip


def grpo_command(out_dir: Path, *extra: str) -> list[str]:
    """``agentloop train`` of the GRPO-step shape (0.5B, 64 × 8 Calc-v0 episodes ≤ 1k tokens)."""
    return [sys.executable, "-c", "import sys; from agentloop.cli import main; sys.exit(main())",
            "train", "grpo_calc_tiny", f"model.path={MODELS / 'qwen2-0.5B'}",
            "actor.device=cuda", "actor.dtype=bfloat16", "actor.lr=1e-6",
            "actor.max_tokens_per_micro_batch=16384", "engine.dtype=bfloat16",
            "engine.enforce_eager=false", "engine.kv_cache_memory_bytes=8589934592",
            "engine.max_num_seqs=512", "rollout.max_prompt_len=512",
            "rollout.max_response_len=1024", "rollout.n=8", "rollout.concurrency=512",
            "rollout.parser=hermes",
            "trainer.prompts_per_step=64", "trainer.mini_batches=2", "trainer.val_every=0",
            "trainer.val_before_train=false", "algorithm.dynamic_sampling=false",
            "data.env_kwargs.digits=3", "checkpoint.every=0", "checkpoint.save_final=false",
            "checkpoint.export_final=false", "logging.tensorboard=false", "logging.wandb=false",
            f"trainer.out_dir={out_dir}", *extra]  # fmt: skip


def run_phase(
    name: str, cmd: list[str], out: Path, timeout_s: float, gpu: int | None = None
) -> dict[str, object]:
    """Run one phase (on GPU ``gpu`` alone when given), log to ``<phase>.log``."""
    env = dict(os.environ) if gpu is None else dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
    t0 = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s,
                                cwd="/tmp", env=env).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            rc = "timeout"
    status = {"phase": name, "rc": rc, "seconds": round(time.perf_counter() - t0, 1), "gpu": gpu}
    metrics = out / ("grpo" if name == "grpo_step" else name) / "metrics.jsonl"
    if name.startswith("grpo_") and metrics.is_file():
        # step 2: warm, and in one_step the last step that overlaps generation (the final step
        # only trains the batch generated during the one before)
        steps = [json.loads(line) for line in metrics.read_text().splitlines()]
        warm = next((m for m in steps if m.get("step") == 2), steps[-1])
        (out / f"{name}.json").write_text(json.dumps(warm, indent=2))
    print(json.dumps(status), flush=True)
    return status


def _row(metric: str, ours: float, unit: str, ceiling: float | None, ceiling_name: str) -> dict:
    ratio = ours / ceiling if ceiling else None
    return {"metric": metric, "ours": ours, "unit": unit, "ceiling": ceiling,
            "ceiling_name": ceiling_name, "ratio": ratio}  # fmt: skip


def rows(results: dict[str, object]) -> list[dict]:
    """The final table, from whatever phases produced results."""
    out: list[dict] = []
    ceil = results.get("ceilings") or {}
    peak, copy = ceil.get("bf16_matmul_TFLOPs"), ceil.get("copy_GBps")
    if peak:
        out.append(_row("bf16 matmul 8192³", peak, "TFLOP/s", None, "(the peak)"))
    if copy:
        out.append(_row("device copy_ (D2D)", copy, "GB/s", None, "(the ceiling)"))
    for r in results.get("weight_sync") or []:
        for transport in ("cuda_ipc", "file"):
            if transport not in r:  # weight_sync.py --transports left it out
                continue
            ws = r[transport]
            out.append(_row(f"weight sync {r['size']} {transport} ({ws['bytes'] / 1e9:.2f} GB)",
                            ws["GBps"], "GB/s", copy, "device copy"))  # fmt: skip
        if "cuda_ipc_cast_in_gather" in r:  # new tensors, as a multi-rank gather makes them
            cast = r["cuda_ipc_cast_in_gather"]
            out.append(_row(f"weight sync {r['size']} cuda_ipc, cast in the gather",
                            cast["GBps"], "GB/s", copy, "device copy"))  # fmt: skip
            bound = r["chunk_bytes"] + r["in_flight_bytes"]
            out.append(_row(f"weight sync {r['size']} cuda_ipc, cast in the gather: peak extra",
                            cast["peak_extra_bytes"] / 1e9, "GB", bound / 1e9,
                            "chunk + 2 tensors in flight"))  # fmt: skip
            # the trainer's own sync hands its live parameters: the chunk's buffer is all
            out.append(_row(f"weight sync {r['size']} cuda_ipc peak extra memory",
                            r["cuda_ipc"]["peak_extra_bytes"] / 1e9, "GB",
                            r["chunk_bytes"] / 1e9, "one chunk"))  # fmt: skip
        elif "peak_extra_bytes" in r["cuda_ipc"]:  # before 2026-11-28's chunk packers
            bound = r["chunk_bytes"] + r["largest_tensor_bytes"]
            out.append(_row(f"weight sync {r['size']} cuda_ipc peak extra memory",
                            r["cuda_ipc"]["peak_extra_bytes"] / 1e9, "GB", bound / 1e9,
                            "chunk + largest tensor"))  # fmt: skip
        out.append(_row(f"weight sync {r['size']} max |Δlogprob| engine vs trainer",
                        r["gap_after_sync"], "nats", r["gap_vs_perturbed_before_sync"],
                        "gap before sync"))  # fmt: skip
    for phase, label in (("grpo_step", ""), ("grpo_one_step", ", one_step"),
                         ("grpo_async", ", async")):  # fmt: skip
        grpo = results.get(phase) or {}
        for key in sorted(k for k in grpo if k.startswith(("timing_s/", "perf/"))):
            out.append(_row(f"GRPO step (0.5B, 512 seqs{label}) {key}", grpo[key], "", None, ""))
    for n, workers in ((256, ""), (1024, ""), (256, "_workers"), (1024, "_workers")):
        r = results.get(f"rollout_{n}{workers}") or {}
        name = f"rollout {n} Calc episodes, agent loop" + (
            f" over {r.get('loop_workers')} loop workers" if workers else ""
        )
        if r:
            out.append(_row(name, r["agent_loop_tokens_per_s"],
                            "tok/s", r["ceiling_tokens_per_s"], "plain generate"))  # fmt: skip
            if "replay_tokens_per_s" in r:
                out.append(_row(f"{name} vs its turns replayed",
                                r["agent_loop_tokens_per_s"], "tok/s", r["replay_tokens_per_s"],
                                "same turns, vLLM alone (fair)"))  # fmt: skip
    for r in (results.get("loop_workers") or {}).get("rows", []):
        out.append(_row(f"loop turns/s, fake engine, {r['workers']} loop workers",
                        r["loop_workers_turns_per_s"], "turns/s", r["independent_turns_per_s"],
                        "independent processes"))  # fmt: skip
    if lw := results.get("loop_workers"):
        out.append(_row("loop turns/s, fake engine, one process", lw["one_process_turns_per_s"],
                        "turns/s", None, ""))  # fmt: skip
    for phase in ("train", "train_1.5B", "train_3B"):
        for r in (results.get(phase) or {}).get("runs", []):
            if "mfu" in r:
                out.append(_row(f"train {r['name']}", r["mfu"], "MFU", None, "of measured peak"))
                out.append(_row(f"train {r['name']}", r["tokens_per_s"], "tok/s", None, ""))
    return out


def report(dirs: list[Path], baseline: Path | None = None) -> dict[str, object]:
    """Merge the phase JSONs of ``dirs`` into one table; ``baseline`` (an earlier
    ``results.json``) adds its value of each metric as the "old" column."""
    results: dict[str, object] = {}
    for d in dirs:
        for f in sorted(d.glob("*.json")):
            if f.name != "results.json":
                results[f.stem] = json.loads(f.read_text())
    table = rows(results)
    if baseline is not None:
        old = json.loads(baseline.read_text())["table"]
        before = {(r["metric"], r["unit"]): r["ours"] for r in old}
        for r in table:
            r["old"] = before.get((r["metric"], r["unit"]))
    width = max((len(r["metric"]) for r in table), default=10)
    print(f"{'metric':<{width}}  {'old':>10}  {'ours':>12}  {'unit':<8} {'ceiling':>12}  "
          f"{'ratio':>7}  vs")  # fmt: skip
    for r in table:
        old = "" if r.get("old") is None else f"{r['old']:10.4g}"
        ceiling = "" if r["ceiling"] is None else f"{r['ceiling']:12.4g}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:7.3f}"
        print(f"{r['metric']:<{width}}  {old:>10}  {r['ours']:12.4g}  {r['unit']:<8} "
              f"{ceiling:>12}  {ratio:>7}  {r['ceiling_name']}")  # fmt: skip
    merged = {"table": table, "phases": results,
              "baseline": None if baseline is None else baseline.name}  # fmt: skip
    (dirs[0] / "results.json").write_text(json.dumps(merged, indent=2))
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="results dir (e.g. $OUT on the GPU machine)")
    parser.add_argument("--phases", nargs="+", default=None, help="default: all")
    parser.add_argument("--timeout-s", type=float, default=540.0, help="per phase")
    parser.add_argument("--gpus", type=int, default=1, help="phases side by side, one per GPU")
    parser.add_argument("--report", nargs="+", type=Path, help="merge these result dirs")
    parser.add_argument("--baseline", type=Path, help="an earlier results.json (old column)")
    args = parser.parse_args()
    if args.report:
        report(args.report, args.baseline)
        return
    if args.out is None:
        parser.error("--out is required (or --report DIR ...)")
    args.out.mkdir(parents=True, exist_ok=True)
    commands = phase_commands(args.out)
    names = args.phases or list(commands)
    for name in names:
        if name not in commands:
            parser.error(f"unknown phase {name!r}; phases: {list(commands)}")
    if args.gpus == 1:
        for name in names:
            run_phase(name, commands[name], args.out, args.timeout_s)
    else:
        if "models" in names:
            run_phase("models", commands["models"], args.out, args.timeout_s)
        rest = [n for n in names if n != "models"]
        run_side_by_side(rest, commands, args.out, args.timeout_s, args.gpus)
    report([args.out], args.baseline)


def run_side_by_side(
    names: list[str], commands: dict[str, list[str]], out: Path, timeout_s: float, gpus: int
) -> None:
    """Each phase alone on one of ``gpus`` GPUs; the next phase in ``names`` takes the first
    GPU to come free."""
    free: queue.Queue[int] = queue.Queue()
    for gpu in range(gpus):
        free.put(gpu)

    def one(name: str) -> dict[str, object]:
        gpu = free.get()
        try:
            return run_phase(name, commands[name], out, timeout_s, gpu)
        finally:
            free.put(gpu)

    with ThreadPoolExecutor(gpus) as pool:
        list(pool.map(one, names))


if __name__ == "__main__":
    main()
