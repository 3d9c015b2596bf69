"""Process-group setup for the trainer: one code path for 1 local rank, N local ranks, or Ray."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agentloop.errors import ConfigError

__all__ = ["all_reduce_max", "all_reduce_sum", "init_distributed", "run_local_ranks"]


def init_distributed(
    *,
    rank: int | None = None,
    world_size: int | None = None,
    init_method: str | None = None,
    backend: str | None = None,
) -> bool:
    """Initialise the default process group unless one exists; return whether this call did.

    With no arguments and no ``RANK``/``WORLD_SIZE`` in the environment it creates a world of 1
    backed by an in-memory store (no port, no file), so a single local process runs exactly the
    code of N ranks. ``torchrun``/Ray-style ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` variables are honoured. The backend is gloo on CPU; on CUDA it is NCCL for
    CUDA tensors plus gloo for CPU tensors.
    """
    if dist.is_initialized():
        return False
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside world_size {world_size}; use 0 <= rank < size")
    if backend is None:
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
    if init_method is None and world_size == 1 and "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group(
            backend, init_method=init_method or "env://", rank=rank, world_size=world_size
        )
    return True


def all_reduce_sum(values: list[float]) -> list[float]:
    """Element-wise sum of a list of floats over all ranks (fp64, on the CPU group)."""
    t = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_reduce_max(values: list[float]) -> list[float]:
    """Element-wise max of a list of floats over all ranks."""
    t = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _collective_device() -> torch.device:
    # a pure-NCCL group cannot reduce CPU tensors; our default CUDA backend also has gloo for CPU
    backend = str(dist.get_backend())
    if "gloo" in backend or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _rank_main(
    rank: int,
    world_size: int,
    store_path: str,
    out_dir: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    threads: int,
    backend: str,
) -> None:
    torch.set_num_threads(threads)
    init_distributed(
        rank=rank, world_size=world_size, init_method=f"file://{store_path}", backend=backend
    )
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_local_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    threads: int = 1,
    backend: str = "gloo",
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes joined by a process
    group (a ``FileStore`` in a temp dir: no ports), and return each rank's result, rank order.

    ``backend`` ``"gloo"`` runs CPU ranks; ``"cpu:gloo,cuda:nccl"`` gives rank ``r`` GPU ``r``.

    ``fn`` must be importable by name (module level) and its result ``torch.save``-able. A failing
    rank raises here with its traceback. For tests and local multi-rank debugging; Ray mode starts
    its own processes and calls :func:`init_distributed` in each.
    """
    with tempfile.TemporaryDirectory(prefix="agentloop-dist-") as tmp:
        store = str(Path(tmp) / "store")
        mp.spawn(
            _rank_main,
            args=(world_size, store, tmp, fn, args, threads, backend),
            nprocs=world_size,
            join=True,
        )
        return [
            torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(world_size)
        ]
