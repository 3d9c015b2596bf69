"""Weight sync on one GPU: trainer (FSDP2 PolicyWorker) → colocated vLLM engine, in place.

For each model size: GB/s of the colocated trainer's own sync (``ColocatedWorker.sync_weights``),
``VLLMEngine.update_weights(worker.state_dict_for_inference())``: on one rank the tensors are the
live fp32 master weights, each cast into the engine's dtype as it is packed. With the
``cuda_ipc`` transport (the weights stay on the GPU), beside it ``cuda_ipc_cast_in_gather``
(``state_dict_for_inference(dtype=engine.weight_dtype)``: a new tensor per weight, as a
multi-rank gather makes and as the trainer did before 2026-11-28), and the ``file`` transport
(through /dev/shm) for comparison; the trainer process's peak extra GPU memory during each
``cuda_ipc`` sync (``torch.cuda.max_memory_allocated`` above what was allocated before it) next
to its bound: the chunk's buffer (``engine.weight_chunk_bytes``, or the largest block) plus the
two tensors in flight; sleep/wake costs; and a check that after the sync the engine scores
tokens as the trainer's new weights do.

    python bench/gpu/weight_sync.py --tokenizer DIR --models /root/models --out results/ws.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import torch
from models import make_model_dir

from agentloop.engines.base import SamplingParams
from agentloop.engines.vllm import VLLMEngine
from agentloop.trainers.packing import TrainSeq
from agentloop.trainers.worker import PolicyWorker, WorkerConfig


def _perturb(worker: PolicyWorker, scale: float = 0.02) -> None:
    """Move every weight so the synced model is measurably different from the served one."""
    gen = torch.Generator(device=worker.device).manual_seed(1)
    with torch.no_grad():
        for p in worker.model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.add_(torch.randn(local.shape, generator=gen, device=local.device) * scale)


async def _score_gap(engine: VLLMEngine, worker: PolicyWorker, prompt: list[int]) -> float:
    """max |engine logprob − trainer logprob| over 32 greedy tokens after ``prompt``."""
    out = await engine.generate(prompt, SamplingParams(max_tokens=32, temperature=0.0))
    ids = torch.tensor([*prompt, *out.token_ids])
    seq = TrainSeq(ids, torch.ones(len(ids)), torch.zeros(len(ids)), torch.zeros(len(ids)))
    mine = worker.compute_logprobs([seq])[0][len(prompt) :]
    return float((mine - torch.tensor(out.logprobs)).abs().max())


async def _timed(coro_fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        await coro_fn()
        times.append(time.perf_counter() - t0)
    return times


async def bench_size(
    size: str, model_dir: Path, repeats: int, transports: list[str]
) -> dict[str, object]:
    worker = PolicyWorker(model_dir, WorkerConfig(device="cuda", dtype="bfloat16"))
    engine = VLLMEngine.create(
        model_dir, dtype="bfloat16", max_model_len=2048, kv_cache_memory_bytes=4 << 30,
        enforce_eager=True, enable_sleep_mode=True,
        gpu_memory_utilization=0.5,  # vLLM's start-up check: the trainer already holds memory
    )  # fmt: skip
    result: dict[str, object] = {"size": size}
    async with engine:
        prompt = list(range(10, 42))
        result["gap_before_sync"] = await _score_gap(engine, worker, prompt)
        _perturb(worker)
        result["gap_vs_perturbed_before_sync"] = await _score_gap(engine, worker, prompt)
        variants = [(t, t, None) for t in transports]
        if "cuda_ipc" in transports:
            variants.append(("cuda_ipc_cast_in_gather", "cuda_ipc", engine.weight_dtype))
        for key, transport, dtype in variants:
            n = repeats if transport == "cuda_ipc" else max(2, repeats // 2)  # file: seconds
            stats, peaks = [], []
            for _ in range(n + 1):  # the first sync warms up; it is not counted
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
                weights = worker.state_dict_for_inference(dtype=dtype)
                stats.append(await engine.update_weights(weights, transport=transport))
                peaks.append(torch.cuda.max_memory_allocated() - before)
            stats = stats[1:]
            total = statistics.median(s.total_s for s in stats)
            result[key] = {
                "bytes": stats[0].num_bytes,
                "tensors": stats[0].num_tensors,
                "total_s": total,
                "pack_s": statistics.median(s.serialize_s for s in stats),
                "load_s": statistics.median(s.load_s for s in stats),
                "GBps": stats[0].num_bytes / total / 1e9,
                "direct": all(s.direct for s in stats),
                "peak_extra_bytes": max(peaks[1:]),
            }
        result["chunk_bytes"] = engine.config.weight_chunk_bytes
        sizes = [t.numel() * 2 for _, t in worker.state_dict_for_inference()]  # bf16 in the engine
        result["largest_tensor_bytes"] = max(sizes)
        # a new tensor per weight (cast in the gather) holds two at a time: the one being packed
        # and the next one read
        result["in_flight_bytes"] = max(a + b for a, b in zip(sizes, [*sizes[1:], 0], strict=True))
        result["gap_after_sync"] = await _score_gap(engine, worker, prompt)
        result["sleep1_s"] = statistics.median(await _timed(lambda: engine.sleep(1), 1))
        result["wake_s"] = statistics.median(await _timed(lambda: engine.wake_up(), 1))
        await engine.sleep(2)
        t0 = time.perf_counter()
        await engine.wake_up(["weights"])
        await engine.update_weights(worker.state_dict_for_inference(), transport="cuda_ipc")
        await engine.wake_up(["kv_cache"])
        result["sleep2_wake_reload_s"] = time.perf_counter() - t0
        result["gap_after_sleep2_reload"] = await _score_gap(engine, worker, prompt)
    del worker
    torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokenizer", type=Path, required=True, help="dir with tokenizer files")
    parser.add_argument("--models", type=Path, default=Path("/root/models"))
    parser.add_argument("--sizes", nargs="+", default=["0.5B", "1.5B", "3B"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--transports", nargs="+", default=["cuda_ipc", "file"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results = []
    for size in args.sizes:
        model_dir = make_model_dir(size, args.models / f"qwen2-{size}", args.tokenizer)
        results.append(asyncio.run(bench_size(size, model_dir, args.repeats, args.transports)))
        print(json.dumps(results[-1], indent=2), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
