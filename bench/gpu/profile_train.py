"""Where a training step's time goes: one ``PolicyWorker.train_step`` under the torch profiler.

The step is ``bench/train_throughput.py``'s packed step (same model shapes, same log-normal batch,
FSDP2 on one rank). Printed, for each variant asked for:

- the step's wall time, tokens/s and MFU (against a bf16 matmul measured in the same run);
- the GPU's busy share of the step (kernel time ÷ wall: the rest is the GPU waiting for Python
  and launches) and the kernel time per category (matmuls, attention, the optimizer, the rest);
- the top kernels and the top CPU-side ops by self time.

Variants change one thing each: ``base`` (the worker as configured), ``op_by_op_logprobs``
(the log-softmax blocks run op by op, as before they were compiled on CUDA), ``fused_adam``
(``torch.optim.AdamW(fused=True)``), ``chunk4k`` (log-softmax chunks of 4,096 rows, not 1,024).

    python bench/gpu/profile_train.py --model-size 0.5B --out $OUT/profile
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/ (not a package)
from train_throughput import (
    SIZES,
    lognormal_lengths,
    make_seqs,
    matmul_peak_tflops,
    model_flops,
)
from transformers import Qwen2Config

from agentloop.trainers import logprobs as logprobs_module
from agentloop.trainers.worker import PolicyWorker, WorkerConfig

VARIANTS = ("base", "op_by_op_logprobs", "fused_adam", "chunk4k", "compiled_mlp_norm")
# kernel name fragments → category (first match wins; names lower-cased)
CATEGORIES = (
    ("attention", ("flash", "fmha", "attention")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "sm90_", "sm80_")),
    ("reduce/softmax", ("reduce", "softmax", "logsumexp")),
    ("copy/cast", ("copy", "cast", "convert")),
)


def category(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "elementwise/other"


def _variant(worker: PolicyWorker, name: str) -> Callable[[], None]:
    """Set ``worker`` up as variant ``name``; returns what undoes it."""
    if name == "fused_adam":
        old = worker.optimizer
        groups = old.param_groups[0]
        worker.optimizer = torch.optim.AdamW(
            groups["params"], lr=groups["lr"], betas=groups["betas"], eps=groups["eps"],
            weight_decay=groups["weight_decay"], fused=True,
        )  # fmt: skip

        def undo() -> None:
            worker.optimizer = old

        return undo
    if name == "op_by_op_logprobs":
        compiled = logprobs_module._block_fns

        def op_by_op(_device: torch.device) -> Any:
            return logprobs_module._chunk_forward, logprobs_module._chunk_backward

        logprobs_module._block_fns = op_by_op

        def undo_op_by_op() -> None:
            logprobs_module._block_fns = compiled

        return undo_op_by_op
    if name == "chunk4k":
        real = logprobs_module.token_logprobs

        def bigger_chunks(*args: Any, **kwargs: Any) -> Any:
            kwargs["chunk_size"] = 4096
            return real(*args, **kwargs)

        import agentloop.trainers.worker as worker_module

        worker_module.token_logprobs = bigger_chunks

        def undo_chunks() -> None:
            worker_module.token_logprobs = real

        return undo_chunks
    if name == "compiled_mlp_norm":
        return _compile_mlp_norm(worker.model)
    return lambda: None


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen2RMSNorm's forward as a function of its input and weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Qwen2MLP's forward (SwiGLU, no biases) as a function of its input and weights."""
    f = torch.nn.functional
    return f.linear(f.silu(f.linear(x, gate)) * f.linear(x, up), down)


def _compile_mlp_norm(model: torch.nn.Module, backend: str = "inductor") -> Callable[[], None]:
    """Run every RMSNorm and MLP of a Qwen2 model through one compiled function each (the
    weights are inputs, so the 24-49 instances share one compilation); returns the undo."""
    rms = torch.compile(_rms_norm, dynamic=True, backend=backend)
    mlp = torch.compile(_mlp, dynamic=True, backend=backend)
    swapped: list[tuple[torch.nn.Module, Any]] = []
    for module in model.modules():
        kind = type(module).__name__
        if kind.endswith("RMSNorm"):
            forward: Any = lambda x, m=module: rms(x, m.weight, m.variance_epsilon)  # noqa: E731
        elif kind.endswith("MLP"):
            forward = lambda x, m=module: mlp(  # noqa: E731
                x, m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight
            )
        else:
            continue
        swapped.append((module, module.__dict__.get("forward")))
        module.forward = forward

    def undo() -> None:
        for module, old in swapped:
            if old is None:
                del module.forward
            else:
                module.forward = old

    return undo


def profile_step(worker: PolicyWorker, seqs: Sequence[Any], steps: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    worker.train_step(seqs)  # warm-up (allocator, autotuning)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        worker.train_step(seqs)
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - t0) / steps
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        worker.train_step(seqs)
        torch.cuda.synchronize()
    kernels: dict[str, float] = defaultdict(float)
    cats: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            us = ev.device_time
            kernels[ev.name] += us
            cats[category(ev.name)] += us
    cpu_self = sorted(
        ((e.key, e.self_cpu_time_total, e.count) for e in prof.key_averages()),
        key=lambda r: -r[1],
    )[:15]
    busy_s = sum(kernels.values()) / 1e6
    top_kernels = sorted(kernels.items(), key=lambda kv: -kv[1])[:20]
    return {
        "step_s": step_s,
        "gpu_busy_s": busy_s,
        "gpu_busy_share": busy_s / step_s,
        "by_category_s": {k: v / 1e6 for k, v in sorted(cats.items(), key=lambda kv: -kv[1])},
        "top_kernels": [[k, v / 1e6] for k, v in top_kernels],
        "top_cpu_self": [[k, us / 1e6, n] for k, us, n in cpu_self],
    }


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-size", default="0.5B", choices=[s for s in SIZES if s != "tiny"])
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--num-seqs", type=int, default=64)
    p.add_argument("--median-len", type=int, default=1024)
    p.add_argument("--max-tokens-per-micro-batch", type=int, default=16384)
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    config = Qwen2Config(max_position_embeddings=8192, rms_norm_eps=1e-6, **SIZES[args.model_size])
    lengths = lognormal_lengths(args.num_seqs, args.median_len, 0.9, 16, 8192, 0)
    seqs = make_seqs(lengths, config.vocab_size, 0)
    peak = matmul_peak_tflops(torch.device("cuda"))
    flops = model_flops(config, lengths)
    worker = PolicyWorker(config, WorkerConfig(
        lr=1e-6, device="cuda", dtype="bfloat16",
        activation_checkpointing=args.activation_checkpointing,
        max_tokens_per_micro_batch=args.max_tokens_per_micro_batch,
    ))  # fmt: skip
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "model_size": args.model_size, "tokens": sum(lengths), "peak_tflops": peak,
        "step_flops": flops, "variants": {},
    }  # fmt: skip
    print(f"{args.model_size}: {sum(lengths):,} tokens/step, matmul peak {peak:.0f} TFLOP/s")
    for name in args.variants:
        undo = _variant(worker, name)
        try:
            r = profile_step(worker, seqs, args.steps)
        finally:
            undo()
        r["mfu"] = flops / r["step_s"] / (peak * 1e12)
        r["tokens_per_s"] = sum(lengths) / r["step_s"]
        results["variants"][name] = r
        print(f"\n== {name}: step {r['step_s']:.3f} s, {r['tokens_per_s']:,.0f} tok/s, "
              f"MFU {r['mfu']:.1%}, GPU busy {r['gpu_busy_share']:.0%}")  # fmt: skip
        for cat, s in r["by_category_s"].items():
            print(f"   {cat:<20} {s:8.3f} s  {s / r['step_s']:6.1%} of the step")
        print("   top kernels:")
        for k, s in r["top_kernels"][:12]:
            print(f"     {s:8.3f} s  {k[:110]}")
        print("   top CPU ops (self):")
        for k, s, n in r["top_cpu_self"][:10]:
            print(f"     {s:8.3f} s  x{n:<6} {k[:100]}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"profile_{args.model_size}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
