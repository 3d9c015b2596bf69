"""Disaggregated weight push over NCCL: trainer rank 0 (GPU 0) → a rollout worker (GPU 1).

``agentloop.trainers.weight_push`` (header, then flat buckets) pushes Qwen2-shaped bf16 tensors
from one process to another; the ceiling is one NCCL broadcast of a single flat buffer of the
same bytes in the same group. Both sides check the received tensors bit for bit (a checksum of
every tensor), so a wrong bucket plan or a torn transfer fails the run.

    python bench/gpu/weight_push_nccl.py --size 0.5B --out push.json   # 2 GPUs, repo root
Needs ``import agentloop`` to work (``source bench/gpu/setup.sh``) and torch with CUDA.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import time
from typing import Any

SIZES = {  # (vocab, hidden, intermediate, layers, kv_heads × head_dim)
    "tiny": (2048, 256, 512, 4, 128),
    "0.5B": (151936, 896, 4864, 24, 128),
    "1.5B": (151936, 1536, 8960, 28, 256),
}


def qwen2_like(size: str, device: Any) -> list[tuple[str, Any]]:
    import torch

    vocab, h, inter, layers, kv = SIZES[size]
    g = torch.Generator(device=device).manual_seed(0)

    def t(*shape: int) -> Any:
        return torch.randn(*shape, generator=g, device=device, dtype=torch.bfloat16)

    out = [("model.embed_tokens.weight", t(vocab, h))]
    shapes = {"self_attn.q_proj.weight": (h, h), "self_attn.q_proj.bias": (h,),
              "self_attn.k_proj.weight": (kv, h), "self_attn.v_proj.weight": (kv, h),
              "self_attn.o_proj.weight": (h, h), "mlp.gate_proj.weight": (inter, h),
              "mlp.up_proj.weight": (inter, h), "mlp.down_proj.weight": (h, inter),
              "input_layernorm.weight": (h,)}  # fmt: skip
    for i in range(layers):
        out += [(f"model.layers.{i}.{name}", t(*shape)) for name, shape in shapes.items()]
    return [*out, ("model.norm.weight", t(h))]


def member(rank: int, port: int, size: str, repeats: int, out: Any) -> None:
    import torch

    from agentloop.trainers.weight_push import open_push_group

    torch.cuda.set_device(rank)
    group = open_push_group("127.0.0.1", port, rank, 2, backend="nccl", timeout_s=300)
    weights = qwen2_like(size, torch.device("cuda", 0)) if rank == 0 else []
    nbytes = sum(t.numel() * t.element_size() for _, t in weights)
    times, flat_times, sums = [], [], []
    for _ in range(repeats + 1):  # the first push warms NCCL up and is not timed
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        got = group.send(weights) if rank == 0 else [x for b in group.receive() for x in b]
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if rank == 1:
            nbytes = sum(t.numel() * t.element_size() for _, t in got)
            sums = [float(t.float().sum()) for _, t in got]
        flat = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=torch.device("cuda", rank))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        group._broadcast(flat)
        torch.cuda.synchronize()
        flat_times.append(time.perf_counter() - t0)
    if rank == 0:
        sums = [float(t.float().sum()) for _, t in weights]
    out.put((rank, {"bytes": nbytes, "push_s": min(times[1:]), "flat_s": min(flat_times[1:]),
                    "sums": sums}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="0.5B", choices=sorted(SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=member, args=(r, port, args.size, args.repeats, q)) for r in (0, 1)]
    for p in procs:
        p.start()
    res = dict(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(60)
    sender, receiver = res[0], res[1]
    result = {
        "size": args.size,
        "GB": sender["bytes"] / 1e9,
        "intact": sender["sums"] == receiver["sums"] and sender["bytes"] == receiver["bytes"],
        "push_GBps": sender["bytes"] / 1e9 / receiver["push_s"],
        "flat_broadcast_GBps": sender["bytes"] / 1e9 / receiver["flat_s"],
    }
    result["ratio"] = result["push_GBps"] / result["flat_broadcast_GBps"]
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
