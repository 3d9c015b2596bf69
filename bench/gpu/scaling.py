"""Data-parallel scaling of the FSDP2 train step: 1, 2, 4, … GPUs on one fixed global batch.

For each world size W (``--worlds``; default 1 and each power of two up to the GPUs present),
W ranks joined over NCCL (``run_local_ranks``) each build a ``PolicyWorker`` of the shape
(``--model-size``, default 1.5B, bf16 compute, fp32 master weights), take their share of the same
global batch the way the trainer shards it (``shard_indices``), and time ``train_step``. Per W
it prints the step time (slowest rank), tokens/s, MFU (model FLOPs per step / step time / (peak
× W), the peak a dense bf16 matmul measured in this run) and peak memory per GPU, next to the
ceiling: linear scaling from the smallest world run, W / W₀ × the W₀-GPU tokens/s (W₀ = 1 by
default; a 7B does not fit one 80 GB GPU, so ``--worlds 2,4`` measures it against 2 GPUs).

    python bench/gpu/scaling.py --out scaling.json           # on the GPU machine, after setup.sh
    python bench/gpu/scaling.py --model-size 7B --worlds 2,4 --out scaling_7b.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from train_throughput import (  # bench/ is not a package: its folder is on sys.path
    SIZES,
    lognormal_lengths,
    make_seqs,
    matmul_peak_tflops,
    model_flops,
)

from agentloop.trainers.dist import run_local_ranks
from agentloop.trainers.group import shard_indices
from agentloop.trainers.worker import PolicyWorker, WorkerConfig


def _config(size: str) -> Qwen2Config:
    return Qwen2Config(max_position_embeddings=8192, rms_norm_eps=1e-6, **SIZES[size])


def _rank(rank: int, world: int, size: str, lengths: list[int], opts: dict[str, Any]) -> dict:
    """One rank: its shard of the global batch, ``warmup`` then ``steps`` timed train steps."""
    seqs = make_seqs(lengths, SIZES[size]["vocab_size"], opts["seed"])
    mine = [seqs[i] for i in shard_indices(lengths, world)[rank]]
    cfg = WorkerConfig(lr=1e-6, device="cuda", dtype="bfloat16", seed=opts["seed"],
                       activation_checkpointing=opts["activation_checkpointing"],
                       max_tokens_per_micro_batch=opts["max_tokens_per_micro_batch"])  # fmt: skip
    worker = PolicyWorker(_config(size), cfg)
    torch.cuda.reset_peak_memory_stats()
    for _ in range(opts["warmup"]):
        worker.train_step(mine)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(opts["steps"]):
        worker.train_step(mine)
    torch.cuda.synchronize()
    return {
        "step_s": (time.perf_counter() - t0) / opts["steps"],
        "tokens": sum(len(s) for s in mine),
        "peak_mem_GiB": torch.cuda.max_memory_allocated() / 2**30,
    }


def world_list(spec: str) -> list[int]:
    """``--worlds``: GPU counts such as ``4`` or ``2,4``, sorted."""
    try:
        worlds = sorted({int(w) for w in spec.split(",")})
    except ValueError:
        msg = f"{spec!r} is not a comma-separated list of GPU counts"
        raise argparse.ArgumentTypeError(msg) from None
    if not worlds or worlds[0] < 1:
        raise argparse.ArgumentTypeError(f"{spec!r}: GPU counts must be >= 1")
    return worlds


def scale(args: argparse.Namespace) -> dict[str, Any]:
    gpus = torch.cuda.device_count()
    worlds = args.worlds or [w for w in (1, 2, 4, 8) if w <= gpus]
    if worlds[-1] > gpus:
        raise SystemExit(f"--worlds {worlds}: only {gpus} GPU(s) present")
    lengths = lognormal_lengths(args.num_seqs, args.median_len, 0.9, 16, 8192, args.seed)
    flops = model_flops(_config(args.model_size), lengths)
    peak = matmul_peak_tflops(torch.device("cuda"))
    opts = {"seed": args.seed, "warmup": args.warmup_steps, "steps": args.steps,
            "activation_checkpointing": args.activation_checkpointing == "on",
            "max_tokens_per_micro_batch": args.max_tokens_per_micro_batch}  # fmt: skip
    print(f"worlds {worlds}; ceiling: linear from {worlds[0]} GPU(s)", flush=True)
    rows = []
    for world in worlds:
        ranks = run_local_ranks(_rank, world, args.model_size, lengths, opts,
                                backend="cpu:gloo,cuda:nccl")  # fmt: skip
        step_s = max(r["step_s"] for r in ranks)
        rows.append({
            "gpus": world, "step_s": step_s, "tokens_per_s": sum(lengths) / step_s,
            "mfu": flops / step_s / (peak * 1e12 * world),
            "peak_mem_GiB": max(r["peak_mem_GiB"] for r in ranks),
            "tokens_per_rank": [r["tokens"] for r in ranks],
        })  # fmt: skip
        ceiling = rows[0]["tokens_per_s"] * world / worlds[0]  # linear from the smallest world
        rows[-1]["ceiling_tokens_per_s"] = ceiling
        rows[-1]["scaling_efficiency"] = rows[-1]["tokens_per_s"] / ceiling
        print(_row(rows[-1]), flush=True)
    return {
        "device": torch.cuda.get_device_name(), "gpus": gpus, "model_size": args.model_size,
        "peak_tflops": peak, "step_flops": flops, "batch_tokens": sum(lengths),
        "ceiling_base_gpus": worlds[0],
        "num_seqs": len(lengths), "args": {k: str(v) for k, v in vars(args).items()},
        "rows": rows,
    }  # fmt: skip


def _row(r: dict[str, Any]) -> str:
    return (f"{r['gpus']} GPU(s): {r['step_s']:7.3f} s/step  {r['tokens_per_s']:>10,.0f} tok/s "
            f"(ceiling {r['ceiling_tokens_per_s']:>10,.0f}, {r['scaling_efficiency']:5.1%})  "
            f"MFU {r['mfu']:6.2%}  peak {r['peak_mem_GiB']:5.1f} GiB/GPU")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-size", choices=tuple(SIZES), default="1.5B")
    p.add_argument("--worlds", type=world_list, default=None,
                   help="GPU counts to run, e.g. 4 or 2,4 (default: 1, 2, 4, … up to the GPUs "
                        "present); the ceiling is linear from the smallest")  # fmt: skip
    p.add_argument("--num-seqs", type=int, default=64, help="global batch (sequences)")
    p.add_argument("--median-len", type=int, default=1024, help="log-normal median length")
    p.add_argument("--max-tokens-per-micro-batch", type=int, default=16384)
    p.add_argument("--activation-checkpointing", choices=("on", "off"), default="on")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup-steps", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    result = scale(args)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
