"""A weight update in chunks, the sender's side: where the stream of tensors is cut, and how each
chunk is packed for vLLM's workers while the tensors arrive.

The extra memory of an update is one packed chunk: a tensor is packed (cast to the engine's
dtype into a flat CUDA buffer, or copied to host memory) as soon as it arrives and is not held
after that, so the sender never holds a chunk of tensors next to its packed copy, whatever the
model's size; a trainer hands its live parameters (one rank) or one gathered tensor at a time.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from agentloop.engines.vllm_ext import (
    CudaIpcBuffer,
    pack_tensors,
    safetensors_bytes,
    write_safetensors,
)

__all__ = ["ChunkPlan", "Packed", "Packer", "block_of", "make_packer"]


def block_of(name: str) -> str:
    """The block a checkpoint tensor belongs to: its path up to the first index
    (``model.layers.3.mlp.up_proj.weight`` → ``model.layers.3``), else its module
    (``model.embed_tokens.weight`` → ``model.embed_tokens``)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1])


@dataclass
class ChunkPlan:
    """Where a stream of checkpoint tensors is cut into chunks of at most ``limit`` bytes.

    A chunk ends only between blocks (:func:`block_of`): vLLM processes a fused layer
    (``qkv_proj``, ``gate_up_proj``) once per reload, from the parts that reload gave it, so a
    block split across two reloads would keep garbage in its other parts. A block starts a new
    chunk when all of its tensors (their sizes from the checkpoint's shapes, ``block_numel``)
    would not fit in the current one; a block larger than ``limit`` is a chunk alone."""

    limit: int
    block_numel: Mapping[str, int]
    _used: int = 0
    _block: str | None = None

    @classmethod
    def for_checkpoint(cls, shapes: Mapping[str, tuple[int, ...]], limit: int) -> ChunkPlan:
        numel: Counter[str] = Counter()
        for name, shape in shapes.items():
            numel[block_of(name)] += math.prod(shape)
        return cls(limit, numel)

    def capacity(self, itemsize: int) -> int:
        """The most bytes a chunk of ``itemsize``-byte elements can hold: the limit, or the
        largest block when that is larger, but never more than the whole checkpoint."""
        numel = self.block_numel.values()
        if not numel:
            return self.limit
        return min(max(self.limit, max(numel) * itemsize), sum(numel) * itemsize)

    def starts_chunk(self, name: str, numel: int, itemsize: int) -> bool:
        """Take the next tensor; whether the chunk so far must be sent before it."""
        block = block_of(name)
        cut = False
        if block != self._block and self._used:
            block_bytes = self.block_numel.get(block, numel) * itemsize
            cut = self._used + block_bytes > self.limit
        if cut:
            self._used = 0
        self._block = block
        self._used += numel * itemsize
        return cut


@dataclass
class Packed:
    """One chunk, ready for the workers: the worker method to call and its argument."""

    method: str
    arg: Any
    num_tensors: int
    num_bytes: int


class Packer(Protocol):
    """Packs the tensors of one chunk at a time, as they arrive."""

    def itemsize(self, tensor: torch.Tensor) -> int:
        """Bytes per element of ``tensor`` once packed."""
        ...

    def add(self, name: str, tensor: torch.Tensor) -> None: ...

    @property
    def num_tensors(self) -> int: ...

    async def packed(self) -> Packed:
        """The chunk so far, for the workers; valid until :meth:`clear`."""
        ...

    def clear(self) -> None:
        """Start the next chunk (the workers have loaded this one)."""
        ...


class IpcPacker:
    """Casts each tensor into its slot of one flat CUDA buffer (``cuda_ipc``), reused for every
    chunk of the update: the buffer is the update's whole extra device memory."""

    def __init__(self, plan: ChunkPlan, shapes: Mapping[str, tuple[int, ...]], dtype: torch.dtype,
                 device: torch.device) -> None:  # fmt: skip
        size = torch.empty((), dtype=dtype).element_size()
        self._buffer = CudaIpcBuffer(plan.capacity(size), shapes, dtype, device)

    def itemsize(self, tensor: torch.Tensor) -> int:
        return self._buffer.itemsize

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self._buffer.add(name, tensor)

    @property
    def num_tensors(self) -> int:
        return self._buffer.num_tensors

    async def packed(self) -> Packed:
        buffer = self._buffer
        payload = buffer.payload()
        return Packed("agentloop_reload_from_cuda_ipc", payload, buffer.num_tensors,
                      buffer.num_bytes)  # fmt: skip

    def clear(self) -> None:
        self._buffer.clear()


@dataclass
class HostPacker:
    """Copies each floating-point tensor to host memory in the engine's ``dtype`` as it arrives
    (what the engine's load would cast it to); the chunk travels as one safetensors file in
    ``shm_dir`` (``file``) or as a blob inside the RPC message (``bytes``)."""

    transport: str
    shapes: Mapping[str, tuple[int, ...]]
    dtype: torch.dtype
    shm_dir: str
    _tensors: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    _file: Path | None = None

    def itemsize(self, tensor: torch.Tensor) -> int:
        return self._dtype_of(tensor).itemsize

    def _dtype_of(self, tensor: torch.Tensor) -> torch.dtype:
        return self.dtype if tensor.is_floating_point() else tensor.dtype

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self._tensors.append((name, tensor.detach().to("cpu", self._dtype_of(tensor))))

    @property
    def num_tensors(self) -> int:
        return len(self._tensors)

    async def packed(self) -> Packed:
        tensors = pack_tensors(self._tensors, self.shapes)
        num_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        if self.transport == "bytes":
            blob = await asyncio.to_thread(safetensors_bytes, tensors)
            return Packed("agentloop_reload_from_bytes", blob, len(tensors), num_bytes)
        path = await asyncio.to_thread(write_safetensors, tensors, self.shm_dir)
        self._file = Path(path)
        return Packed("agentloop_reload_from_file", path, len(tensors), num_bytes)

    def clear(self) -> None:
        self._tensors = []
        if self._file is not None:
            self._file.unlink(missing_ok=True)
            self._file = None


def make_packer(transport: str, first: torch.Tensor, plan: ChunkPlan,
                shapes: Mapping[str, tuple[int, ...]], dtype: torch.dtype,
                shm_dir: str) -> Packer:  # fmt: skip
    """The packer of ``transport`` (``auto``: ``cuda_ipc`` for CUDA tensors, else ``file``), for
    an update whose first tensor is ``first`` and whose engine holds ``dtype`` weights."""
    if transport == "auto":
        transport = "cuda_ipc" if first.is_cuda else "file"
    if transport == "cuda_ipc":
        return IpcPacker(plan, shapes, dtype, first.device)
    return HostPacker(transport, shapes, dtype, shm_dir)
