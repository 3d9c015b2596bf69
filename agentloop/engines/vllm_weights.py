"""Loading a weight update into vLLM's workers, chunk by chunk as the tensors arrive."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentloop.engines.base import NamedTensors, WeightSyncStats, named_pairs
from agentloop.engines.vllm_config import VLLMConfig
from agentloop.errors import ConfigError, InferenceError

if TYPE_CHECKING:
    import torch

    from agentloop.engines.weight_chunks import Packer

__all__ = ["load_in_chunks", "merged_stats"]


async def load_in_chunks(
    llm: Any,
    named: NamedTensors,
    transport: str,
    ckpt_shapes: Mapping[str, tuple[int, ...]],
    weight_dtype: torch.dtype,
    config: VLLMConfig,
) -> list[WeightSyncStats]:
    """Pack the tensors as they arrive and have every worker load each chunk as it fills
    (``weight_chunks.ChunkPlan``): the extra memory is one packed chunk."""
    from agentloop.engines.weight_chunks import ChunkPlan, make_packer

    plan = ChunkPlan.for_checkpoint(ckpt_shapes, config.weight_chunk_bytes)
    packer = None
    loads: list[WeightSyncStats] = []
    pack_s = 0.0
    async for name, tensor in named_pairs(named):
        t0 = time.perf_counter()
        if packer is None:
            packer = make_packer(transport, tensor, plan, ckpt_shapes, weight_dtype, config.shm_dir)
        if plan.starts_chunk(name, tensor.numel(), packer.itemsize(tensor)):
            loads.append(await _load_chunk(llm, packer, pack_s, config.weight_sync_timeout_s))
            t0, pack_s = time.perf_counter(), 0.0
        packer.add(name, tensor)
        pack_s += time.perf_counter() - t0
    if packer is not None and packer.num_tensors:
        loads.append(await _load_chunk(llm, packer, pack_s, config.weight_sync_timeout_s))
    return loads


async def _load_chunk(llm: Any, packer: Packer, pack_s: float, timeout_s: float) -> WeightSyncStats:
    """Have every worker load the packed chunk (``pack_s``: the time its tensors took to
    pack so far), then empty the packer for the next one."""
    t0 = time.perf_counter()
    try:
        packed = await packer.packed()
        t1 = time.perf_counter()
        results: list[Any] = await llm.collective_rpc(
            packed.method, timeout=timeout_s, args=(packed.arg,)
        )
    except ConfigError:
        raise
    except Exception as e:
        raise InferenceError(
            f"weight update of {packer.num_tensors} tensors failed in vLLM: {type(e).__name__}: {e}"
        ) from e
    finally:
        packer.clear()
    return WeightSyncStats(
        num_tensors=packed.num_tensors,
        num_bytes=packed.num_bytes,
        serialize_s=pack_s + t1 - t0,
        load_s=max(r["seconds"] for r in results),
        total_s=pack_s + time.perf_counter() - t0,
        direct=all(r.get("direct", 0.0) for r in results),
    )


def merged_stats(loads: Sequence[WeightSyncStats], total_s: float) -> WeightSyncStats:
    """One update's statistics from its chunks' (``total_s``: the whole update's time)."""
    return WeightSyncStats(
        num_tensors=sum(x.num_tensors for x in loads),
        num_bytes=sum(x.num_bytes for x in loads),
        serialize_s=sum(x.serialize_s for x in loads),
        load_s=sum(x.load_s for x in loads),
        total_s=total_s,
        direct=all(x.direct for x in loads),
        chunks=len(loads),
    )
