"""Per-GPU peak memory of a real recipe run (default: ReTool 7B, colocated) against its plan.

Runs ``agentloop train RECIPE`` (the real entry point, ``placement: ray``, one FSDP2 worker and
one colocated vLLM engine per GPU) on a seeded random-init model of the real shape (``--size``,
``bench/gpu/models.py``) and small MathTool-v0 task files, for a few steps. The recipe's
memory-relevant settings stay as written (actor dtype, activation checkpointing,
``max_tokens_per_micro_batch``, ``engine.gpu_memory_utilization``, ``max_num_seqs``,
``rollout.n``); the overrides (``run_overrides``) only shrink the run: one prompt per GPU per step
(16 trajectories each), ``--steps`` steps, no validation, no checkpoints, no dynamic sampling (a
random model scores 0 on every task, so DAPO would drop every group). A random model writes to
the length limit, so every trajectory is ~``--max-response-len`` tokens and the micro-batches
are full. The sandbox is ``fake`` (in-process, unisolated): the GPU machine has no bubblewrap,
and a random model's "code" is noise that rarely even parses.

While it runs, ``nvidia-smi`` is sampled every 0.2 s: the peak used memory per GPU counts every
process (trainer workers and vLLM engines). Printed: per GPU peak / total / headroom, the plan
on paper for the recipe's own ``num_workers`` and for this run's (FSDP2 state = params × 16 B / W
for fp32 master weights, gradients and Adam's two moments; the engine's budget =
``gpu_memory_utilization`` × total; the weight sync = two chunks of
``engine.weight_chunk_bytes``; activations not counted) and the step metrics of
``metrics.jsonl``. Everything goes to ``--out`` as JSON, the sampled timeline included; a
failed or timed-out run exits 1 after its log tail.

    source bench/gpu/setup.sh                       # on the GPU machine (4 H100s), repo root
    python bench/gpu/recipe_memory.py --work /root/recipe_mem --out $OUT/recipe_memory.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from models import SIZES, make_model_dir, num_params, qwen2_config

from agentloop.envs.math_tool import MATH_SCHEMA
from agentloop.envs.task_files import write_tasks
from agentloop.trainers.config import TrainConfig, load_config
from agentloop.trainers.metrics import read_metrics
from agentloop.trainers.weight_push import BUCKET_BYTES

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RECIPE = ROOT / "recipes" / "retool" / "dapo_7b.yaml"
TOKENIZER = ROOT / ".gpu-stage" / "tiny-qwen2"  # as run_all.py: the tiny model's tokenizer
ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
       "VLLM_USE_FLASHINFER_SAMPLER": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # fmt: skip
SMI = ["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"]
MAX_LEN = 32768  # the random model's max_position_embeddings (Qwen2.5-7B/32B-Instruct's)
GIB = 2**30


def query_gpus() -> dict[int, tuple[int, int]]:
    """GPU index → (used MiB, total MiB), every process counted."""
    out = subprocess.run(SMI, capture_output=True, text=True, check=True, timeout=30).stdout
    rows = [[int(x) for x in line.split(",")] for line in out.strip().splitlines()]
    return {index: (used, total) for index, used, total in rows}


class GpuSampler(threading.Thread):
    """Samples ``query_gpus`` every ``interval_s`` until ``stop``: the max used MiB per GPU and
    the timeline ``[t_s, used MiB of each GPU in indices]``."""

    def __init__(self, indices: list[int], interval_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.indices, self.interval_s = indices, interval_s
        self.peak_mib = dict.fromkeys(indices, 0)
        self.timeline: list[list[float]] = []
        self._done = threading.Event()
        self._t0 = time.monotonic()

    def run(self) -> None:
        while not self._done.is_set():
            try:
                used = {i: u for i, (u, _) in query_gpus().items() if i in self.peak_mib}
            except (subprocess.SubprocessError, ValueError):
                used = {}  # one failed query is a gap in the timeline, not the end of sampling
            for i, mib in used.items():
                self.peak_mib[i] = max(self.peak_mib[i], mib)
            if used:
                t = round(time.monotonic() - self._t0, 2)
                self.timeline.append([t, *(used.get(i, 0) for i in self.indices)])
            self._done.wait(self.interval_s)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)


def write_task_files(work: Path, splits: list[str]) -> dict[str, str]:
    """MathTool-v0 task files: 64 training problems for ``train``, 4 for every other split."""

    def rows(n: int, tag: str) -> list[dict[str, str]]:
        return [{"id": f"{tag}-{i}", "prompt": f"Compute {i} * {i + 7} + 3.",
                 "answer": str(i * (i + 7) + 3)} for i in range(n)]  # fmt: skip

    files = {}
    for split in splits:
        n = 64 if split == "train" else 4
        path = write_tasks(rows(n, split), work / "data" / f"{split}.jsonl", MATH_SCHEMA)
        files[split] = str(path)
    return files


def run_overrides(
    model_dir: Path, files: dict[str, str], out_dir: Path, gpus: int, args: argparse.Namespace
) -> list[str]:
    """``key=value`` overrides that shrink the recipe's run and leave its memory settings."""
    length = args.max_response_len
    return [
        f"model.path={model_dir}",
        *(f"data.env_kwargs.files.{split}={path}" for split, path in files.items()),
        "data.env_kwargs.sandbox=fake",
        f"rollout.max_response_len={length}",
        "rollout.max_turns=4",
        "algorithm.dynamic_sampling=false",
        f"algorithm.overlong_buffer={length // 4}",  # the recipe's 4k of 16k, scaled
        f"trainer.num_workers={gpus}",
        f"trainer.prompts_per_step={gpus}",
        f"trainer.mini_batches={2 if gpus % 2 == 0 else 1}",
        f"trainer.total_steps={args.steps}",
        "trainer.val_before_train=false",
        "trainer.val_every=0",  # any N > 0 also validates after the last step
        f"trainer.out_dir={out_dir}",
        "checkpoint.every=0",
        "checkpoint.save_final=false",
        "checkpoint.export_final=false",
        "checkpoint.resume=never",
        "logging.wandb=false",
        "logging.tensorboard=false",
        "logging.progress=false",
        *args.set,
    ]


def plan(cfg: TrainConfig, params: int, workers: int, total_gib: float) -> dict[str, float]:
    """Memory per GPU on paper (GiB), activations and the CUDA contexts not counted."""
    colocated = cfg.trainer.rollout_workers == 0
    fsdp = params * (4 + 4 + 8) / workers / GIB
    engine = cfg.engine.gpu_memory_utilization * total_gib if colocated else 0.0
    # one packed chunk; on several ranks also a bucket of gathered tensors (weight_push.py)
    sync = (cfg.engine.weight_chunk_bytes + (BUCKET_BYTES if workers > 1 else 0)) / GIB
    return {"workers": workers, "fsdp_state_GiB": fsdp, "engine_budget_GiB": engine,
            "sync_chunks_GiB": sync, "sum_GiB": fsdp + engine + sync,
            "headroom_GiB": total_gib - (fsdp + engine + sync)}  # fmt: skip


def run_train(cmd: list[str], log: Path, env: dict[str, str], timeout_s: float) -> int | str:
    """Run ``cmd`` in its own process group (from /tmp: the repo root's ``agentloop/`` folder
    would shadow the package); on timeout (or Ctrl-C) end that group only. The exit status, or
    "timeout"."""
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd="/tmp", env=env,
                                start_new_session=True)  # fmt: skip
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _end_group(proc)
            return "timeout"
        except BaseException:
            _end_group(proc)
            raise


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group ``proc`` leads (its Ray and vLLM children), SIGKILL after
    30 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=30)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def step_metrics(out_dir: Path) -> list[dict[str, float]]:
    """Each step's timings, throughput, sync size, memory metrics and micro-batch fill."""
    keep = ("timing_s/", "perf/", "sync/", "actor/tokens", "actor/micro_batches",
            "actor/seqs", "rollout/response_len_mean")  # fmt: skip
    return [
        {"step": step, **{k: v for k, v in m.items() if k.startswith(keep) or "mem" in k}}
        for step, m in sorted(read_metrics(out_dir).items())
    ]


def gpu_rows(sampler: GpuSampler, before: dict[int, tuple[int, int]]) -> list[dict[str, float]]:
    rows = []
    for i in sampler.indices:
        peak, total = sampler.peak_mib[i] / 1024, before[i][1] / 1024
        rows.append({"gpu": i, "idle_GiB": before[i][0] / 1024, "peak_GiB": peak,
                     "total_GiB": total, "headroom_GiB": total - peak})  # fmt: skip
    return rows


def print_report(result: dict[str, Any]) -> None:
    """Per GPU peak/total/headroom; plan (recipe's W, this run's W) vs measured; step metrics."""
    print(f"{'GPU':>3}  {'peak GiB':>9}  {'total GiB':>9}  {'headroom GiB':>12}")
    for g in result["gpus"]:
        print(f"{g['gpu']:>3}  {g['peak_GiB']:9.2f}  {g['total_GiB']:9.2f}  "
              f"{g['headroom_GiB']:12.2f}")  # fmt: skip
    recipe, run = result["plan"]["recipe"], result["plan"]["run"]
    util = result["engine"]["gpu_memory_utilization"]
    print(f"\n{'per GPU, GiB (plan: no activations)':<40}  {'plan W=' + str(recipe['workers']):>10}"
          f"  {'plan W=' + str(run['workers']):>10}  {'measured':>9}")  # fmt: skip
    for label, key in (("FSDP2 state, 16 B/param / W", "fsdp_state_GiB"),
                       (f"engine budget, {util} × total", "engine_budget_GiB"),
                       ("weight sync: a chunk (+ a gather bucket)", "sync_chunks_GiB"),
                       ("sum", "sum_GiB")):  # fmt: skip
        print(f"{label:<40}  {recipe[key]:10.2f}  {run[key]:10.2f}")
    gpus = result["gpus"]
    peak = max((g["peak_GiB"] for g in gpus), default=0.0)
    room = min((g["headroom_GiB"] for g in gpus), default=0.0)
    print(f"{'peak used, max over GPUs (nvidia-smi)':<40}  {'':>10}  {'':>10}  {peak:9.2f}")
    print(f"{'headroom, total − sum / min over GPUs':<40}  {recipe['headroom_GiB']:10.2f}  "
          f"{run['headroom_GiB']:10.2f}  {room:9.2f}")  # fmt: skip
    for s in result["steps"]:
        values = "  ".join(f"{k}={v:.4g}" for k, v in s.items() if k != "step")
        print(f"step {s['step']}: {values}")


def make_model(size: str, dest: Path, tokenizer: Path) -> None:
    """The random model dir, built in a child process: this one never holds a CUDA context,
    which nvidia-smi would count in every sample."""
    if not (tokenizer / "tokenizer.json").is_file():
        from agentloop.models.tiny import make_tiny_model

        tokenizer = make_tiny_model(dest.parent / "tiny-qwen2")
    child = multiprocessing.get_context("spawn").Process(
        target=make_model_dir, args=(size, dest, tokenizer, MAX_LEN)
    )
    child.start()
    child.join()
    if child.exitcode != 0:
        raise SystemExit(f"building the random {size} model in {dest} failed ({child.exitcode})")


def prepare(args: argparse.Namespace, gpus: int) -> tuple[list[str], TrainConfig, TrainConfig]:
    """Task files under ``--work``, and the train command with its overrides, checked against
    the recipe's schema (an unknown key fails here); the recipe's config and the run's."""
    work, recipe = args.work.resolve(), args.recipe.resolve()
    recipe_cfg = load_config(TrainConfig, recipe)
    splits = dict.fromkeys(["train", *recipe_cfg.data.env_kwargs.get("files", {})])
    files = write_task_files(work, list(splits))
    model_dir = work / f"qwen2-{args.size}-random"
    overrides = run_overrides(model_dir, files, work / "run", gpus, args)
    cfg = load_config(TrainConfig, recipe, overrides)
    cmd = [sys.executable, "-c", "import sys; from agentloop.cli import main; sys.exit(main())",
           "train", str(recipe), *overrides]  # fmt: skip
    return cmd, recipe_cfg, cfg


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Build the model, run the recipe under the sampler, and collect the results."""
    work = args.work.resolve()
    before = query_gpus()
    indices = sorted(before)[: args.gpus or None]
    cmd, recipe_cfg, cfg = prepare(args, len(indices))
    shutil.rmtree(work / "run", ignore_errors=True)
    make_model(args.size, Path(cfg.model.path), args.tokenizer)
    env = {**os.environ, **ENV, "CUDA_VISIBLE_DEVICES": ",".join(map(str, indices))}
    sampler = GpuSampler(indices)
    sampler.start()
    t0 = time.perf_counter()
    rc = run_train(cmd, work / "train.log", env, args.timeout_s)
    seconds = time.perf_counter() - t0
    sampler.stop()
    params, total_gib = num_params(qwen2_config(args.size)), before[indices[0]][1] / 1024
    plans = {"recipe": plan(recipe_cfg, params, recipe_cfg.trainer.num_workers, total_gib),
             "run": plan(cfg, params, cfg.trainer.num_workers, total_gib)}  # fmt: skip
    return {"recipe": str(args.recipe), "size": args.size, "params": params, "rc": rc,
            "seconds": seconds, "cmd": cmd, "overrides": cmd[5:], "plan": plans,
            "gpus": gpu_rows(sampler, before),
            "steps": step_metrics(work / "run"), "log": str(work / "train.log"),
            "engine": {"gpu_memory_utilization": cfg.engine.gpu_memory_utilization,
                       "dtype": cfg.engine.dtype},
            "timeline_columns": ["t_s", *(f"gpu{i}_MiB" for i in indices)],
            "timeline": sampler.timeline}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--recipe", type=Path, default=RECIPE)
    p.add_argument("--size", choices=tuple(SIZES), default="7B", help="the random model's shape")
    p.add_argument("--work", type=Path, default=Path("/root/recipe_memory"),
                   help="model dir, task files, run dir and train.log go here")  # fmt: skip
    p.add_argument("--tokenizer", type=Path, default=TOKENIZER,
                   help="dir with tokenizer files (default: the staged tiny model's; "
                        "built under --work when missing)")  # fmt: skip
    p.add_argument("--gpus", type=int, default=0, help="GPUs (one worker each); 0: all")
    p.add_argument("--steps", type=int, default=2, help="trainer.total_steps")
    p.add_argument("--max-response-len", type=int, default=4096)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="one more override, after the script's own (repeatable)")  # fmt: skip
    p.add_argument("--timeout-s", type=float, default=480.0,
                   help="limit on the train run (then its process group is ended)")  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="JSON results")
    p.add_argument("--dry-run", action="store_true",
                   help="write the task files, check the overrides against the recipe and print "
                        "the train command (workers: --gpus, else 4); no GPU needed")  # fmt: skip
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        cmd, _, _ = prepare(args, args.gpus or 4)
        print(" \\\n  ".join(shlex.quote(c) for c in cmd))
        return 0
    result = measure(args)
    print_report(result)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")
    if result["rc"] != 0:
        tail = Path(result["log"]).read_text(errors="replace").splitlines()[-60:]
        print("\n".join(tail), file=sys.stderr)
        print(f"train run failed: rc={result['rc']}; log {result['log']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
