"""Adapter-only weight sync into vLLM on a CUDA GPU (marker ``gpu``; skipped without one): a LoRA
policy colocated with its engine sends the adapter alone, the engine serves it in place, and the
base weights survive the level-1 sleep that a LoRA run's sync mode uses.

    source bench/gpu/setup.sh && python3 -m pytest -q -s -m gpu tests/engines/test_vllm_lora_gpu.py
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from agentloop.engines.base import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

RANK = 8


@pytest.fixture(autouse=True)
def _spawn() -> Iterator[None]:
    """vLLM's processes start by spawn, as in a colocated run (this process has touched CUDA)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        yield


async def _gap(w: Any, prompt: list[int]) -> tuple[float, list[float]]:
    """max |engine − trainer| logprob over 24 greedy tokens, and the engine's logprobs."""
    from agentloop.trainers.packing import TrainSeq

    out = await w.generate(prompt, SamplingParams(max_tokens=24, temperature=0.0))
    ids = torch.tensor([*prompt, *out.token_ids])
    seq = TrainSeq(ids, torch.ones(len(ids)), torch.zeros(len(ids)), torch.zeros(len(ids)))
    mine = (await w.compute_logprobs([seq]))[0][len(prompt) :]
    return float((mine - torch.tensor(out.logprobs)).abs().max()), list(out.logprobs)


async def test_the_adapter_alone_is_synced_and_served_in_place(tiny_model_dir: Path) -> None:
    from agentloop.trainers.colocated import ColocatedWorker, WorkerSpec
    from agentloop.trainers.lora_config import LoraConfig
    from agentloop.trainers.packing import TrainSeq
    from agentloop.trainers.worker_config import WorkerConfig

    actor = WorkerConfig(device="cuda", dtype="bfloat16", lr=5e-2,
                         lora=LoraConfig(rank=RANK, alpha=2 * RANK))  # fmt: skip
    engine = {"backend": "vllm", "dtype": "bfloat16", "max_model_len": 512, "lora_rank": RANK,
              "gpu_memory_utilization": 0.2, "enable_sleep_mode": True}  # fmt: skip
    w = ColocatedWorker(WorkerSpec(str(tiny_model_dir), actor, engine, threaded=False))
    await w.start_engine()
    await w.setup(0, 1, None)
    try:
        prompt = list(range(20, 52))
        base_gap, base_lps = await _gap(w, prompt)
        assert base_gap < 0.1  # B = 0: the policy is the base model
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(10, 2000, (4, 48), generator=g)
        mask = torch.ones(48)
        mask[0] = 0
        seqs = [TrainSeq(t, mask, mask * (1.0 if i % 2 else -1.0), torch.zeros(48))
                for i, t in enumerate(ids)]  # fmt: skip
        for step in (1, 2):
            await w.sleep_engine(1)  # the base goes to host memory and comes back
            await w.train_step(seqs)
            await w.wake_engine(["weights"])
            stats = await w.sync_weights(step)
            await w.wake_engine(["kv_cache"])
            assert w.engine is not None and w.engine.version == step
            policy = w.policy
            assert policy is not None and policy.lora is not None
            adapter = policy.adapter_weights(torch.bfloat16)  # the engine's dtype
            assert stats["sync/bytes"] == adapter.num_bytes  # the adapter, not the model
            full = sum(p.numel() * 2 for _, p in policy.state_dict_for_inference())
            assert stats["sync/bytes"] < full / 10
            gap, lps = await _gap(w, prompt)
            assert gap < 0.1, step  # bf16 engine vs bf16-compute trainer
        moved = max(abs(a - b) for a, b in zip(lps, base_lps, strict=False))
        assert moved > 0.1  # the served adapter is the trained one, not the initial one
    finally:
        await w.close()
