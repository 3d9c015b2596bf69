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
    """The part of VLLMEngine a sync uses."""

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


async def test_a_sync_on_one_rank_hands_the_engine_the_live_parameters(
    tiny_model_dir: Path,
) -> None:
    """On one rank the sync copies nothing: the engine gets the trainer's fp32 master weights
    themselves, and casts each into its own dtype as it packs it (agentloop/engines/
    weight_chunks.py), so the sync's extra memory is the engine's one packed chunk."""
    spec = WorkerSpec(str(tiny_model_dir), WorkerConfig(device="cpu"), engine=None, threaded=False)
    worker = ColocatedWorker(spec)
    await worker.setup(0, 1, None)
    try:
        engine = worker.engine = _RecordingEngine()
        await worker.sync_weights(version=1)
        assert worker.policy is not None
        params = {p.to_local().data_ptr() for p in worker.policy.model.parameters()}  # DTensors
        assert engine.received and {t.dtype for _, t in engine.received} == {torch.float32}
        assert {t.data_ptr() for _, t in engine.received} <= params  # views, not copies
    finally:
        worker.engine = None
        await worker.close()
