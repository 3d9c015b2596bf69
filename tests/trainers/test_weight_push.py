"""The weight push protocol over a real gloo group: one sender, two receivers, several buckets."""

from __future__ import annotations

import multiprocessing as mp
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from agentloop.trainers.weight_push import buckets, open_push_group, stream


def _weights() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("a.weight", torch.randn(16, 8, generator=g)),
        ("a.bias", torch.randn(16, generator=g)),
        ("b.weight", torch.randn(4, 4, generator=g).to(torch.bfloat16)),
        ("c.weight", torch.randn(300, generator=g)),  # larger than a bucket: a bucket alone
        ("d.scale", torch.randn(1, generator=g)),
    ]


def _names(groups: Iterator[list[tuple[str, torch.Tensor]]]) -> list[list[str]]:
    return [[name for name, _ in bucket] for bucket in groups]


def test_buckets_group_consecutive_tensors_of_one_dtype_up_to_the_size() -> None:
    # 512 B buckets: a (512 B) alone, a.bias (64 B) starts the next; bf16 and c alone
    assert _names(buckets(_weights(), 512)) == [
        ["a.weight"],
        ["a.bias"],
        ["b.weight"],
        ["c.weight"],
        ["d.scale"],
    ]
    assert _names(buckets(_weights(), 1 << 20)) == [
        ["a.weight", "a.bias"],
        ["b.weight"],
        ["c.weight", "d.scale"],
    ]


def test_buckets_read_the_tensors_lazily_one_bucket_ahead_at_most() -> None:
    """What bounds a push's memory: the sender gathers a tensor only when its bucket fills."""
    pulled: list[str] = []

    def gathered() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in _weights():
            pulled.append(name)
            yield name, tensor

    seen = []
    for bucket in buckets(gathered(), 512):
        seen += [name for name, _ in bucket]
        assert len(pulled) <= len(seen) + 1, (pulled, seen)


def _member(rank: int, port: int, out: Any) -> None:
    group = open_push_group("127.0.0.1", port, rank, 3, backend="gloo", timeout_s=60)
    if rank == 0:
        out.put((rank, group.send(_weights(), bucket_bytes=600)))
    else:
        got = [item for bucket in group.receive() for item in bucket]
        out.put((rank, [(n, t.dtype, t.tolist()) for n, t in got]))


@pytest.mark.slow  # three gloo ranks in processes of their own (~12 s)
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


async def test_a_stream_closed_early_still_reads_every_group() -> None:
    """A consumer that fails mid-update (the engine's load raised) must not strand its peers
    in a half-done gather or push: closing the stream reads the rest of the groups."""
    read: list[int] = []

    def groups() -> Iterator[int]:
        for i in range(5):
            read.append(i)
            yield i

    async def run(fn: Any, *args: Any) -> Any:
        return fn(*args)

    source = stream(groups(), run)
    assert await anext(source) == 0
    await source.aclose()
    assert read == [0, 1, 2, 3, 4]


def test_a_model_larger_than_a_bucket_streams_with_one_bucket_alive(tiny_model_dir: Any) -> None:
    """The memory bound of a weight sync or push, counted: a real policy's weights, converted to
    the engine's dtype (bf16: each one a new tensor) and grouped into buckets much smaller than
    the model, are never more than one bucket plus the one tensor read ahead alive at a time
    (a tensor larger than a bucket is a bucket alone), and every byte arrives."""
    import weakref

    from agentloop.trainers.worker import PolicyWorker, WorkerConfig

    worker = PolicyWorker(tiny_model_dir, WorkerConfig(device="cpu", dtype="float32"))
    bucket_bytes = 64 << 10
    live = {"bytes": 0, "peak": 0}

    def forget(nbytes: int) -> None:
        live["bytes"] -= nbytes

    def counted() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in worker.state_dict_for_inference(dtype=torch.bfloat16):
            nbytes = tensor.numel() * tensor.element_size()
            live["bytes"] += nbytes
            live["peak"] = max(live["peak"], live["bytes"])
            weakref.finalize(tensor, forget, nbytes)
            yield name, tensor

    sizes: list[list[int]] = []  # per bucket, its tensors' bytes
    for bucket in buckets(counted(), bucket_bytes):
        sizes.append([t.numel() * t.element_size() for _, t in bucket])
        del bucket  # the consumer has loaded it
    model_bytes = sum(t.numel() * 2 for _, t in worker.state_dict_for_inference())  # bf16
    assert sum(map(sum, sizes)) == model_bytes > 20 * bucket_bytes
    assert max(map(sum, sizes)) <= max(bucket_bytes, *(max(s) for s in sizes))
    # the most ever alive: a bucket, and the first tensor of the next (read to know it is full)
    bound = max(sum(a) + b[0] for a, b in zip(sizes, [*sizes[1:], [0]], strict=True))
    assert live["peak"] <= bound < 2 * max(bucket_bytes, *(max(s) for s in sizes))
    assert live["bytes"] == 0
