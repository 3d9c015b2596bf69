"""The weight push protocol over a real gloo group: one sender, two receivers, several buckets."""

from __future__ import annotations

import multiprocessing as mp
import socket
from typing import Any

import torch

from agentloop.trainers.weight_push import TensorMeta, open_push_group, plan_buckets


def _weights() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("a.weight", torch.randn(16, 8, generator=g)),
        ("a.bias", torch.randn(16, generator=g)),
        ("b.weight", torch.randn(4, 4, generator=g).to(torch.bfloat16)),
        ("c.weight", torch.randn(300, generator=g)),  # larger than a bucket: a bucket alone
        ("d.scale", torch.randn(1, generator=g)),
    ]


def test_buckets_group_consecutive_tensors_of_one_dtype_up_to_the_size() -> None:
    meta = [TensorMeta(n, tuple(t.shape), str(t.dtype)) for n, t in _weights()]
    # 512 B buckets: a (512 B) alone, a.bias (64 B) starts the next; bf16 and c alone
    assert plan_buckets(meta, 512) == [[0], [1], [2], [3], [4]]
    assert plan_buckets(meta, 1 << 20) == [[0, 1], [2], [3, 4]]


def _member(rank: int, port: int, out: Any) -> None:
    group = open_push_group("127.0.0.1", port, rank, 3, backend="gloo", timeout_s=60)
    if rank == 0:
        out.put((rank, group.send(_weights(), bucket_bytes=600)))
    else:
        got = group.receive(bucket_bytes=600)
        out.put((rank, [(n, t.dtype, t.tolist()) for n, t in got]))


def test_a_push_reaches_every_receiver_intact() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_member, args=(r, port, out)) for r in range(3)]
    for p in procs:
        p.start()
    try:
        results = dict(out.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    expected = [(n, t.dtype, t.tolist()) for n, t in _weights()]
    assert results[0] == sum(t.numel() * t.element_size() for _, t in _weights())
    assert results[1] == expected and results[2] == expected
