"""LoRA vs full fine-tuning of one model shape colocated with vLLM on one GPU (default: 7B).

Each mode runs in a child process of its own (an OOM ends that mode only and is reported as
such), through the trainer's real colocated path, ``ColocatedWorker``: vLLM starts first (sleep
mode on), then the FSDP2 policy (bf16 compute, fp32 master weights, activation checkpointing);
each step generates ``--batch`` sequences of ``--prompt-len`` + ``--response-len`` random tokens,
puts the engine to sleep (level 1 under LoRA: the base stays in host memory, since only the
adapter is synced; level 2 for full fine-tuning, which reloads every weight), trains one step,
wakes the engine and syncs: the adapter alone under LoRA (``update_adapter``, reloaded in place),
every weight over CUDA IPC otherwise. Printed per mode: the trainer's peak allocated memory, the
GPU's peak used memory (nvidia-smi, every process), the state held after building, step time,
tokens/s and MFU (6·N·tokens / time / peak, the usual convention: a LoRA step computes less, so
its MFU reads low), sync bytes and seconds, and the engine-vs-trainer logprob gap (bf16).

    source bench/gpu/setup.sh
    python bench/gpu/models.py --tokenizer .gpu-stage/tiny-qwen2 --sizes 7B   # once
    python bench/gpu/lora_7b.py --tokenizer .gpu-stage/tiny-qwen2 --modes lora --out $OUT/l7.json
    python bench/gpu/lora_7b.py --tokenizer .gpu-stage/tiny-qwen2 --modes full --out $OUT/f7.json
    python bench/gpu/lora_7b.py --tokenizer .gpu-stage/tiny-qwen2 --size 1.5B --out $OUT/l15.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokenizer", type=Path, required=True, help="dir with tokenizer files")
    p.add_argument("--models", type=Path, default=Path("/root/models"))
    p.add_argument("--size", default="7B", help="a bench/shapes.py Qwen2 shape (0.5B ... 32B)")
    p.add_argument("--modes", nargs="+", default=["lora", "full"], choices=["lora", "full"])
    p.add_argument("--rank", type=int, default=64, help="LoRA rank (alpha = 2 x rank)")
    p.add_argument("--steps", type=int, default=3, help="steps per mode (the first warms up)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--response-len", type=int, default=512)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--kv-cache-gib", type=float, default=8.0)
    p.add_argument("--timeout", type=float, default=540.0, help="seconds per mode")
    p.add_argument("--child", choices=["lora", "full"], help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.steps < 2 or args.rank < 1 or args.batch < 1:
        p.error("--steps must be >= 2 (one warm-up), --rank and --batch >= 1")
    return args


def settings(args: argparse.Namespace, mode: str) -> tuple[Any, dict[str, Any]]:
    """The policy's WorkerConfig and the engine's settings of ``mode``."""
    from agentloop.trainers.lora_config import LoraConfig
    from agentloop.trainers.worker_config import WorkerConfig

    lora = LoraConfig(rank=args.rank, alpha=2 * args.rank) if mode == "lora" else LoraConfig()
    actor = WorkerConfig(
        device="cuda", dtype="bfloat16", lr=1e-5, activation_checkpointing=True,
        max_tokens_per_micro_batch=16384, lora=lora,
    )  # fmt: skip
    engine = {
        "backend": "vllm", "dtype": "bfloat16", "enforce_eager": True, "enable_sleep_mode": True,
        "max_model_len": args.prompt_len + args.response_len + 8,
        "max_num_seqs": args.batch, "gpu_memory_utilization": args.gpu_memory_utilization,
        "kv_cache_memory_bytes": int(args.kv_cache_gib * 2**30),
        "lora_rank": args.rank if mode == "lora" else 0,
    }  # fmt: skip
    return actor, engine


async def _batch(worker: Any, args: argparse.Namespace, step: int) -> list[Any]:
    """``--batch`` sampled sequences as TrainSeqs (advantages ±1, old = rollout logprobs)."""
    import torch

    from agentloop.engines.base import SamplingParams
    from agentloop.trainers.packing import TrainSeq

    g = torch.Generator().manual_seed(step)
    prompts = [torch.randint(10, 30000, (args.prompt_len,), generator=g).tolist()
               for _ in range(args.batch)]  # fmt: skip
    sampling = SamplingParams(max_tokens=args.response_len, temperature=1.0)
    outs = await asyncio.gather(*(worker.generate(p, sampling.with_(seed=i))
                                  for i, p in enumerate(prompts)))  # fmt: skip
    seqs = []
    for i, (p, out) in enumerate(zip(prompts, outs, strict=True)):
        n, m = len(p), len(out.token_ids)
        mask = torch.tensor([0.0] * n + [1.0] * m)
        lp = torch.tensor([0.0] * n + list(out.logprobs))
        seqs.append(TrainSeq(torch.tensor([*p, *out.token_ids]), mask,
                             mask * (1.0 if i % 2 else -1.0), lp, old_logprobs=lp))  # fmt: skip
    return seqs


async def run_mode(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    import torch
    from models import make_model_dir, num_params, qwen2_config
    from recipe_memory import GpuSampler

    from agentloop.trainers.colocated import ColocatedWorker, WorkerSpec

    model_dir = make_model_dir(args.size, args.models / f"qwen2-{args.size}", args.tokenizer)
    actor, engine = settings(args, mode)
    sampler = GpuSampler([torch.cuda.current_device()])
    sampler.start()
    w = ColocatedWorker(WorkerSpec(str(model_dir), actor, engine, threaded=False))
    t0 = time.perf_counter()
    await w.start_engine()
    await w.setup(0, 1, None)
    policy = w.policy
    assert policy is not None
    out: dict[str, Any] = {
        "mode": mode, "size": args.size, "params": num_params(qwen2_config(args.size)),
        "trainable_params": sum(p.numel() for p in policy.model.parameters() if p.requires_grad),
        "start_s": time.perf_counter() - t0,
        "trainer_state_gib": torch.cuda.memory_allocated() / 2**30,
    }  # fmt: skip
    steps, syncs = [], []
    torch.cuda.reset_peak_memory_stats()
    try:
        for step in range(1, args.steps + 1):
            seqs = await _batch(w, args, step)
            t1 = time.perf_counter()
            await w.sleep_engine(1 if mode == "lora" else 2)
            metrics = await w.train_step(seqs)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            await w.wake_engine(["weights"])
            sync = await w.sync_weights(step)
            await w.wake_engine(["kv_cache"])
            t3 = time.perf_counter()
            steps.append({"train_s": t2 - t1, "sync_s": t3 - t2, "tokens": sum(map(len, seqs)),
                          "grad_norm": metrics["grad_norm"], **sync})  # fmt: skip
            syncs.append(sync)
            print(mode, step, json.dumps(steps[-1]), flush=True)
        gap = await _gap(w, args)
    finally:
        sampler.stop()
        await w.close()
    timed = steps[1:]
    train_s = statistics.median(s["train_s"] for s in timed)
    tokens = statistics.median(s["tokens"] for s in timed)
    name = torch.cuda.get_device_name()
    peak = next((f for k, f in PEAK_BF16_FLOPS.items() if k in name), None)
    return {
        **out, "gpu": name, "steps": steps,
        "trainer_peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "gpu_peak_used_gib": max(sampler.peak_mib.values()) / 1024,
        "train_step_s": train_s, "tokens_per_s": tokens / train_s,
        "mfu_6N": None if peak is None else 6 * out["params"] * tokens / train_s / peak,
        "sync_bytes": timed[-1].get("sync/bytes"),
        "sync_s": statistics.median(s["sync_s"] for s in timed),
        "engine_vs_trainer_max_gap": gap,
    }  # fmt: skip


async def _gap(w: Any, args: argparse.Namespace) -> float:
    """max |engine − trainer| logprob over one greedy continuation after the last sync."""
    import torch

    from agentloop.engines.base import SamplingParams
    from agentloop.trainers.packing import TrainSeq

    prompt = list(range(100, 164))
    out = await w.generate(prompt, SamplingParams(max_tokens=64, temperature=0.0))
    ids = torch.tensor([*prompt, *out.token_ids])
    seq = TrainSeq(ids, torch.ones(len(ids)), torch.zeros(len(ids)), torch.zeros(len(ids)))
    mine = (await w.compute_logprobs([seq]))[0][len(prompt) :]
    return float((mine - torch.tensor(out.logprobs)).abs().max())


def run_child(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """``mode`` in a process of its own, within ``--timeout``: its result, or its failure."""
    result = args.out.with_name(f"{args.out.stem}.{mode}.json")
    result.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, *sys.argv[1:], "--child", mode]
    env = {**os.environ, "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-2000:]
        return {"mode": mode, "error": f"timed out after {args.timeout} s", "log_tail": str(tail)}
    if proc.returncode == 0 and result.is_file():
        return dict(json.loads(result.read_text()))
    tail = proc.stderr[-3000:]
    oom = "OutOfMemoryError" in proc.stderr or "CUDA out of memory" in proc.stderr
    return {"mode": mode, "error": "OOM" if oom else f"exit {proc.returncode}", "log_tail": tail}


def main() -> None:
    args = parse_args()
    sys.path.insert(0, str(HERE))
    if args.child:
        res = asyncio.run(run_mode(args, args.child))
        args.out.with_name(f"{args.out.stem}.{args.child}.json").write_text(json.dumps(res))
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = [run_child(args, mode) for mode in args.modes]
    for r in results:
        keep = ("mode", "error", "trainable_params", "trainer_state_gib", "trainer_peak_gib",
                "gpu_peak_used_gib", "train_step_s", "tokens_per_s", "mfu_6N", "sync_bytes",
                "sync_s", "engine_vs_trainer_max_gap")  # fmt: skip
        print(json.dumps({k: r[k] for k in keep if k in r}), flush=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
