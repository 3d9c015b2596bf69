"""Weight push over a collective group: trainer rank 0 broadcasts, rollout workers receive.

A push group is its own process group (a TCPStore on trainer rank 0 and a gloo or NCCL group
over it), separate from the trainers' FSDP group, so that rollout workers can join and leave
(restarts) without touching training. One push is a stream of buckets: consecutive tensors of
one dtype packed flat, at most ``bucket_bytes`` each (a larger tensor is a bucket alone). Each
bucket is its header (the tensors' names, shapes and dtype, as JSON) and then its flat tensor;
an empty header ends the push. Neither side ever holds more than one bucket (and the sender's
one tensor in flight): a 32B model is pushed with the memory of a 256 MB bucket, not of a copy
of the model.
"""

from __future__ import annotations

import collections
import datetime
import json
import math
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from agentloop.errors import ConfigError

__all__ = ["BUCKET_BYTES", "PushGroup", "TensorMeta", "buckets", "open_push_group", "stream"]

BUCKET_BYTES = 256 << 20
G = TypeVar("G")
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64)}


@dataclass(frozen=True, slots=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def buckets(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = BUCKET_BYTES
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive tensors of one dtype, grouped into buckets of at most ``bucket_bytes`` (a
    larger tensor is a bucket of its own); ``named`` is read lazily, one bucket ahead at most."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and (bucket[0][1].dtype != tensor.dtype or size + nbytes > bucket_bytes):
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


async def stream(
    groups: Iterator[G], run: Callable[..., Awaitable[Any]]
) -> AsyncGenerator[G, None]:
    """``groups`` as an async iterator, each ``next`` called through ``run`` (an executor: it
    blocks on a collective, a gather or a broadcast). Closed early (its consumer failed), it
    still reads the rest of ``groups`` and drops it, so every peer of those collectives finishes
    instead of waiting for its timeout."""
    try:
        while (group := await run(next, groups, None)) is not None:
            yield group
    finally:
        await run(collections.deque, groups, 0)


class PushGroup:
    """One formation of a push group; rank 0 sends (:meth:`send`), the others :meth:`receive`."""

    def __init__(self, pg: Any, store: Any, rank: int, device: torch.device) -> None:
        self.pg, self.store, self.rank, self.device = pg, store, rank, device

    def _broadcast(self, tensor: torch.Tensor) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self.pg.broadcast([tensor], opts).wait()

    def _send_header(self, header: bytes) -> None:
        self._broadcast(torch.tensor([len(header)], dtype=torch.int64, device=self.device))
        if header:
            self._broadcast(torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self.device))

    def _receive_header(self) -> bytes:
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._broadcast(size)
        if not size.item():
            return b""
        header = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        self._broadcast(header)
        return header.cpu().numpy().tobytes()

    def send(
        self, named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = BUCKET_BYTES
    ) -> int:
        """Broadcast ``named`` (rank 0), read lazily bucket by bucket; returns the bytes sent."""
        sent = 0
        for bucket in buckets(named, bucket_bytes):
            meta = [[n, list(t.shape), str(t.dtype)] for n, t in bucket]
            self._send_header(json.dumps(meta).encode())
            flat = torch.cat([t.detach().to(self.device).reshape(-1) for _, t in bucket])
            self._broadcast(flat)
            sent += flat.numel() * flat.element_size()
        self._send_header(b"")
        return sent

    def receive(self) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Receive one push (ranks > 0), bucket by bucket: ``(name, tensor)`` in the sender's
        order. Lazy: each bucket is broadcast when the iteration reaches it, so iterate to the
        end (the sender waits for every receiver at every bucket)."""
        while header := self._receive_header():
            metas = [TensorMeta(n, tuple(s), d) for n, s, d in json.loads(header.decode())]
            dtype = _DTYPES[metas[0].dtype]
            flat = torch.empty(sum(m.numel for m in metas), dtype=dtype, device=self.device)
            self._broadcast(flat)
            yield list(_split(flat, metas))


def _split(flat: torch.Tensor, metas: list[TensorMeta]) -> Iterator[tuple[str, torch.Tensor]]:
    at = 0
    for m in metas:
        yield m.name, flat[at : at + m.numel].view(m.shape)
        at += m.numel


def open_push_group(
    host: str, port: int, rank: int, world_size: int, *, backend: str, timeout_s: float
) -> PushGroup:
    """Join a push group: rank 0 (the trainer) hosts the store at ``host:port``; every member
    calls this at the same time. ``backend``: ``gloo`` (CPU tensors) or ``nccl`` (CUDA)."""
    import torch.distributed as dist

    if backend not in ("gloo", "nccl"):
        raise ConfigError(f"push group backend {backend!r} must be 'gloo' or 'nccl'")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
    prefix = dist.PrefixStore("agentloop-weight-push", store)
    if backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg: Any = dist.ProcessGroupNCCL(prefix, rank, world_size, opts)
    else:
        device = torch.device("cpu")
        pg = dist.ProcessGroupGloo(prefix, rank, world_size, timeout)
    return PushGroup(pg, store, rank, device)
