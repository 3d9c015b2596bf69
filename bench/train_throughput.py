"""Benchmark: PolicyWorker.train_step tokens/s, packed (padding-free) vs padded micro-batches.

The same long-tailed (log-normal) batch of sequences goes through one optimiser step of the
policy loss in each mode, on the same worker (FSDP2, one rank), with the same micro-batch token
budget:

- ``packed``: ``PolicyWorker.train_step`` itself — sequences concatenated into ``[1, T]``
  micro-batches (position ids restart per sequence), balanced by Karmarkar–Karp;
- ``padded``: the same model, optimiser and loss functions on right-padded ``[B, L_max]``
  micro-batches filled in arrival order while ``B × L_max`` fits the budget (what a trainer
  without packing does); ``padded-sorted`` sorts by length first (the best case of padding).

tokens/s counts real tokens only. MFU = (6·N·tokens + attention FLOPs) / step time / peak, with
N the matmul parameters (all but the input embedding; the LM head counted), attention FLOPs
6·layers·heads·head_dim·ΣL² (causal: half the square, forward + 2× backward) — recomputation by
activation checkpointing is not counted — and the peak a dense matmul measured in the same run
(bf16 8192³ on CUDA, fp32 2048³ on CPU).

    .venv/bin/python bench/train_throughput.py                          # CPU, the tiny model
    python bench/train_throughput.py --device cuda --out train.json     # GPU: ~0.5B Qwen2, bf16,
                                                                        # activation ckpt off + on
Self-contained: torch + transformers + agentloop.trainers (no Ray, no vLLM).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import platform
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from shapes import QWEN2_SHAPES  # bench/ is not a package: its folder is on sys.path
from transformers import Qwen2Config

from agentloop.trainers.logprobs import token_logprobs
from agentloop.trainers.losses import agg_loss, policy_loss
from agentloop.trainers.packing import TrainSeq, pad
from agentloop.trainers.worker import PolicyWorker, WorkerConfig

# Shapes: the tiny test model, and Qwen2.5's (random init, nothing downloaded).
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                 tie_word_embeddings=False),
    **QWEN2_SHAPES,
}  # fmt: skip
MODES = ("packed", "padded", "padded-sorted")


def lognormal_lengths(n: int, median: int, sigma: float, lo: int, hi: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [max(lo, min(hi, round(median * math.exp(rng.gauss(0.0, sigma))))) for _ in range(n)]


def make_seqs(lengths: Sequence[int], vocab: int, seed: int) -> list[TrainSeq]:
    """Random ids; the first quarter of each sequence is prompt (mask 0); ±1 advantages."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        mask = torch.zeros(n)
        mask[n // 4 :] = 1.0
        adv = (torch.randint(0, 2, (1,), generator=g).float() * 2 - 1) * mask
        ids = torch.randint(0, vocab, (n,), generator=g)
        out.append(TrainSeq(ids, mask, adv, torch.zeros(n)))
    return out


def padded_groups(lengths: Sequence[int], budget: int, *, sort: bool) -> list[list[int]]:
    """Greedy micro-batches whose padded size ``B × L_max`` stays within ``budget``."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i]) if sort else range(len(lengths))
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * max(lengths[j] for j in [*cur, i]) > budget:
            groups.append(cur)
            cur = []
        cur.append(i)
    return [*groups, cur] if cur else groups


def padded_step(worker: PolicyWorker, seqs: Sequence[TrainSeq], groups: list[list[int]]) -> None:
    """One optimiser step of the worker's policy loss on padded micro-batches."""
    cfg = worker.config
    model = worker.model
    model.train()
    tokens = float(sum(float(s.loss_mask.sum()) for s in seqs))
    worker.optimizer.zero_grad(set_to_none=True)
    for group in groups:
        b = pad(seqs, group)
        b = dataclasses.replace(
            b,
            **{
                f.name: getattr(b, f.name).to(worker.device)
                for f in dataclasses.fields(b)
                if isinstance(getattr(b, f.name), torch.Tensor)
            },
        )
        lp = token_logprobs(model, b, with_entropy=True).logprobs
        mat, _ = policy_loss(lp, lp.detach(), b.advantages, b.loss_mask, cfg.policy_loss)
        agg_loss(mat, b.loss_mask, "token-mean", global_token_count=tokens).backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], 1.0)
    worker.optimizer.step()


def matmul_peak_tflops(device: torch.device) -> float:
    n, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (2048, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10 if device.type == "cuda" else 3):
        _sync(device)
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / sorted(times)[len(times) // 2] / 1e12


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def model_flops(config: Qwen2Config, lengths: Sequence[int]) -> float:
    """6·N·tokens + causal attention FLOPs (forward + backward) for one step over ``lengths``."""
    h, layers = config.hidden_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q = config.num_attention_heads * head_dim
    kv = config.num_key_value_heads * head_dim
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * config.intermediate_size
    n_matmul = layers * per_layer + config.vocab_size * h
    attn = 6 * layers * q * sum(n * n for n in lengths)
    return 6 * n_matmul * sum(lengths) + attn


def run_mode(worker: PolicyWorker, seqs: list[TrainSeq], mode: str, args: Any) -> dict[str, Any]:
    lengths = [len(s) for s in seqs]
    groups = padded_groups(lengths, args.max_tokens_per_micro_batch, sort=mode == "padded-sorted")
    step = (lambda: worker.train_step(seqs)) if mode == "packed" else (
        lambda: padded_step(worker, seqs, groups))  # fmt: skip
    if worker.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup_steps):
        step()
    _sync(worker.device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    _sync(worker.device)
    secs = (time.perf_counter() - t0) / args.steps
    padded_tokens = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    out = {
        "mode": mode, "step_s": secs, "tokens_per_s": sum(lengths) / secs,
        "micro_batches": len(groups) if mode != "packed" else None,
        "pad_fraction": 0.0 if mode == "packed" else 1 - sum(lengths) / padded_tokens,
    }  # fmt: skip
    if worker.device.type == "cuda":
        out["peak_mem_GiB"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def bench(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(
        "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        else "cpu"
    )  # fmt: skip
    size = args.model_size if args.model_size != "auto" else (
        "0.5B" if device.type == "cuda" else "tiny")  # fmt: skip
    config = Qwen2Config(max_position_embeddings=max(args.max_len, 4096), rms_norm_eps=1e-6,
                         **SIZES[size])  # fmt: skip
    lengths = lognormal_lengths(args.num_seqs, args.median_len, args.sigma, args.min_len,
                                args.max_len, args.seed)  # fmt: skip
    seqs = make_seqs(lengths, config.vocab_size, args.seed)
    peak = matmul_peak_tflops(device)
    flops = model_flops(config, lengths)
    runs = []
    ckpt_settings = {"off": [False], "on": [True], "both": [False, True]}[
        args.activation_checkpointing
    ]
    for attn, ac in itertools.product(args.attn, ckpt_settings):
        wcfg = WorkerConfig(lr=1e-6, device=device.type, dtype=args.dtype, seed=args.seed,
                            attn_implementation=attn, activation_checkpointing=ac,
                            max_tokens_per_micro_batch=args.max_tokens_per_micro_batch)  # fmt: skip
        worker = PolicyWorker(config, wcfg)
        for mode in args.modes:
            r = run_mode(worker, seqs, mode, args)
            r.update(attn=attn, activation_checkpointing=ac, name=_name(size, mode, attn, ac),
                     mfu=flops / r["step_s"] / (peak * 1e12))  # fmt: skip
            runs.append(r)
            print(_row(r), flush=True)
        del worker
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {
        "machine": _machine(device), "model_size": size, "peak_tflops": peak,
        "step_flops": flops, "lengths": {"n": len(lengths), "total": sum(lengths),
        "mean": sum(lengths) / len(lengths), "max": max(lengths), "median": args.median_len,
        "sigma": args.sigma}, "args": vars(args), "runs": runs, "ratios": _ratios(runs),
    }  # fmt: skip


def _ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for attn, ac in sorted({(r["attn"], r["activation_checkpointing"]) for r in runs}):
        by = {
            r["mode"]: r for r in runs if r["attn"] == attn and r["activation_checkpointing"] == ac
        }
        for base in ("padded", "padded-sorted"):
            if "packed" in by and base in by:
                ratio = by["packed"]["tokens_per_s"] / by[base]["tokens_per_s"]
                out.append({"attn": attn, "activation_checkpointing": ac, "packed_over": base,
                            "ratio": ratio})  # fmt: skip
    return out


def _name(size: str, mode: str, attn: str, ac: bool) -> str:
    """E.g. ``0.5B packed ac=off``; an attention other than the default ``auto`` is named."""
    return " ".join(
        [size, mode, *([attn] if attn != "auto" else []), f"ac={'on' if ac else 'off'}"]
    )


def _row(r: dict[str, Any]) -> str:
    mem = f"  {r['peak_mem_GiB']:6.1f} GiB" if "peak_mem_GiB" in r else ""
    return (f"{r['name']:<36} {r['tokens_per_s']:>12,.0f} tok/s  {r['step_s']:8.3f} s/step  "
            f"pad {r['pad_fraction']:5.1%}  MFU {r['mfu']:6.2%}{mem}")  # fmt: skip


def _machine(device: torch.device) -> dict[str, Any]:
    import transformers

    return {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor()
        or platform.machine(), "torch": torch.__version__, "transformers": transformers.__version__,
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
    }  # fmt: skip


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = p.add_argument
    add("--device", choices=("auto", "cpu", "cuda"), default="auto")
    add(
        "--model-size",
        choices=("auto", *SIZES),
        default="auto",
        help="auto: 0.5B on CUDA, else tiny",
    )
    add(
        "--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="compute dtype on CUDA"
    )
    add(
        "--attn",
        nargs="+",
        default=["auto"],
        help="attention implementations, each measured in turn (auto: varlen; on a CPU that is\n"
        "SDPA per sequence: compare with `--attn sdpa varlen`)",
    )
    add("--num-seqs", type=int, default=None, help="sequences per step (default: 64 GPU, 32 CPU)")
    add(
        "--median-len",
        type=int,
        default=None,
        help="log-normal median (default: 1024 GPU, i.e. mean ~1.5k; 128 CPU)",
    )
    add("--sigma", type=float, default=None, help="log-normal sigma (default: 0.9 GPU, 1.0 CPU)")
    add("--min-len", type=int, default=16)
    add("--max-len", type=int, default=None, help="default: 8192 GPU, 1024 CPU")
    add("--max-tokens-per-micro-batch", type=int, default=None, help="default: 16384 GPU, 2048 CPU")
    add("--activation-checkpointing", choices=("off", "on", "both"), default=None,
        help="default: both on CUDA, off on CPU")  # fmt: skip
    add("--modes", nargs="+", choices=MODES, default=list(MODES))
    add("--steps", type=int, default=3, help="timed steps per mode (default: 3)")
    add("--warmup-steps", type=int, default=1)
    add("--seed", type=int, default=0)
    add("--threads", type=int, default=None, help="torch CPU threads (default: torch's own)")
    add("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    gpu = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    defaults = dict(num_seqs=(64, 32), median_len=(1024, 128), sigma=(0.9, 1.0),
                    max_len=(8192, 1024),
                    max_tokens_per_micro_batch=(16384, 2048),
                    activation_checkpointing=("both", "off"))  # fmt: skip
    for key, (on_gpu, on_cpu) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, on_gpu if gpu else on_cpu)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = bench(args)
    print(f"peak matmul: {result['peak_tflops']:.2f} TFLOP/s on {result['machine']['device']}")
    for r in result["ratios"]:
        setting = _name(result["model_size"], "packed", r["attn"], r["activation_checkpointing"])
        print(f"{setting} / {r['packed_over']}: {r['ratio']:.2f}x tokens/s")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
