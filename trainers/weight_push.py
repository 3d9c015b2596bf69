"""Weight push over a collective group: trainer rank 0 broadcasts, rollout workers receive.

A push group is its own process group (a TCPStore on trainer rank 0 and a gloo or NCCL group
over it), separate from the trainers' FSDP group, so that rollout workers can join and leave
(restarts) without touching training. One push is a header (the tensors' names, shapes and
dtypes, as JSON) and then the tensors, packed into flat buckets of at most ``bucket_bytes`` of
one dtype each, in order: the receivers rebuild the same buckets from the header.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from agentloop.errors import ConfigError

__all__ = ["BUCKET_BYTES", "PushGroup", "TensorMeta", "open_push_group", "plan_buckets"]

BUCKET_BYTES = 256 << 20
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64)}


@dataclass(frozen=True, slots=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * _DTYPES[self.dtype].itemsize


def plan_buckets(meta: list[TensorMeta], bucket_bytes: int = BUCKET_BYTES) -> list[list[int]]:
    """Consecutive tensors of one dtype, grouped into buckets of at most ``bucket_bytes`` (a
    larger tensor is a bucket of its own). Sender and receivers compute the same plan."""
    buckets: list[list[int]] = []
    size = 0
    for i, m in enumerate(meta):
        same = buckets and meta[buckets[-1][0]].dtype == m.dtype
        if same and size + m.nbytes <= bucket_bytes:
            buckets[-1].append(i)
            size += m.nbytes
        else:
            buckets.append([i])
            size = m.nbytes
    return buckets


class PushGroup:
    """One formation of a push group; rank 0 sends (:meth:`send`), the others :meth:`receive`."""

    def __init__(self, pg: Any, store: Any, rank: int, device: torch.device) -> None:
        self.pg, self.store, self.rank, self.device = pg, store, rank, device

    def _broadcast(self, tensor: torch.Tensor) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self.pg.broadcast([tensor], opts).wait()

    def send(
        self, named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = BUCKET_BYTES
    ) -> int:
        """Broadcast ``named`` (rank 0); returns the bytes sent."""
        tensors = [(n, t.detach().to(self.device).contiguous()) for n, t in named]
        meta = [TensorMeta(n, tuple(t.shape), str(t.dtype)) for n, t in tensors]
        header = json.dumps([[m.name, list(m.shape), m.dtype] for m in meta]).encode()
        self._broadcast(torch.tensor([len(header)], dtype=torch.int64, device=self.device))
        self._broadcast(torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self.device))
        for bucket in plan_buckets(meta, bucket_bytes):
            flat = torch.cat([tensors[i][1].reshape(-1) for i in bucket])
            self._broadcast(flat)
        return sum(m.nbytes for m in meta)

    def receive(self, bucket_bytes: int = BUCKET_BYTES) -> list[tuple[str, torch.Tensor]]:
        """Receive one push (ranks > 0): ``(name, tensor)`` in the sender's order."""
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._broadcast(size)
        header = torch.zeros(int(size.item()), dtype=torch.uint8, device=self.device)
        self._broadcast(header)
        rows = json.loads(bytes(header.cpu().tolist()).decode())
        meta = [TensorMeta(n, tuple(s), d) for n, s, d in rows]
        out: list[tuple[str, torch.Tensor]] = []
        for bucket in plan_buckets(meta, bucket_bytes):
            dtype = _DTYPES[meta[bucket[0]].dtype]
            flat = torch.empty(sum(meta[i].numel for i in bucket), dtype=dtype, device=self.device)
            self._broadcast(flat)
            out.extend(_split(flat, [meta[i] for i in bucket]))
        return out


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
