"""ColocatedWorker's weight sync: what it gathers for its engine (no vLLM: the engine's side of
``update_weights`` is recorded; tests/engines/test_vllm_engine.py loads real updates)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import torch

from agentloop.engines.vllm import WeightSyncStats
from agentloop.trainers.colocated import ColocatedWorker, WorkerSpec
from agentloop.trainers.worker import WorkerConfig


class _RecordingEngine:
    """The part of VLLMEngine a sync uses; the engine holds bf16 weights."""

    weight_dtype = torch.bfloat16

    def __init__(self) -> None:
        self.received: list[tuple[str, torch.Tensor]] = []

    async def update_weights(
        self,
        groups: AsyncIterator[Sequence[tuple[str, torch.Tensor]]],
        version: int | None = None,
        interrupt: bool = False,
    ) -> WeightSyncStats:
        async for group in groups:
            self.received += group
        nbytes = sum(t.numel() * t.element_size() for _, t in self.received)
        return WeightSyncStats(len(self.received), nbytes, 0.0, 0.0, 0.0)


async def test_a_sync_gathers_the_fp32_master_weights_in_the_engines_dtype(
    tiny_model_dir: Path,
) -> None:
    """``engine.dtype: auto`` on a bf16 model gives an engine of bf16 weights: the sync gathers
    the trainer's fp32 master weights as bf16 (half the bytes), not as fp32."""
    spec = WorkerSpec(str(tiny_model_dir), WorkerConfig(device="cpu"), engine=None, threaded=False)
    worker = ColocatedWorker(spec)
    await worker.setup(0, 1, None)
    try:
        engine = worker.engine = _RecordingEngine()
        stats = await worker.sync_weights(version=1)
        assert worker.policy is not None
        master = dict(worker.policy.state_dict_for_inference())
        assert {t.dtype for t in master.values()} == {torch.float32}
        assert [n for n, _ in engine.received] == list(master)
        assert {t.dtype for _, t in engine.received} == {torch.bfloat16}
        assert stats["sync/bytes"] == sum(t.numel() * 2 for t in master.values())
    finally:
        worker.engine = None
        await worker.close()
