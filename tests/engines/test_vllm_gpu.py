"""vLLM on a CUDA GPU (marker ``gpu``; skipped without one): the colocated weight sync through
CUDA IPC, its verified direct-copy fast path, and token-exact multi-turn rollouts.

Run on the GPU machine with ``bench/gpu/run_all.py --phases tests`` (see bench/gpu/).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.base import SamplingParams
from agentloop.envs import Env, StepResult
from agentloop.rollout import RolloutConfig
from agentloop.types import Completion, Message, Task

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.asyncio(loop_scope="module"),
]

TURNS = 3


async def _gap(engine: Any, worker: Any, prompt: list[int]) -> float:
    """max |engine logprob − trainer logprob| over 24 greedy tokens after ``prompt``."""
    from agentloop.trainers.packing import TrainSeq

    out = await engine.generate(prompt, SamplingParams(max_tokens=24, temperature=0.0))
    ids = torch.tensor([*prompt, *out.token_ids])
    seq = TrainSeq(ids, torch.ones(len(ids)), torch.zeros(len(ids)), torch.zeros(len(ids)))
    mine = worker.compute_logprobs([seq])[0][len(prompt) :]
    return float((mine - torch.tensor(out.logprobs)).abs().max())


def _locals(worker: Any) -> list[torch.Tensor]:
    """The worker's parameters as local tensors (FSDP2 leaves some plain)."""
    return [p.to_local() if hasattr(p, "to_local") else p for p in worker.model.parameters()]


def _perturb(worker: Any, base: list[torch.Tensor] | None = None) -> None:
    """Add noise to the weights (to ``base`` instead, when given: the same scale every time)."""
    with torch.no_grad():
        for i, local in enumerate(_locals(worker)):
            if base is not None:
                local.copy_(base[i])
            local.add_(torch.randn_like(local) * 0.05)


async def test_cuda_ipc_sync_matches_the_trainer_and_the_fast_path_equals_reload(
    tiny_model_dir: Path,
) -> None:
    from agentloop.engines.vllm import VLLMEngine
    from agentloop.trainers.worker import PolicyWorker, WorkerConfig

    worker = PolicyWorker(tiny_model_dir, WorkerConfig(device="cuda", dtype="bfloat16"))
    names = ["model.layers.0.self_attn.qkv_proj.weight", "model.layers.1.mlp.gate_up_proj.weight"]

    def perturb() -> None:
        _perturb(worker)

    async def sync(transport: str) -> Any:
        return await engine.update_weights(worker.state_dict_for_inference(), transport=transport)

    async with VLLMEngine.create(tiny_model_dir, dtype="bfloat16", max_model_len=512,
                                 gpu_memory_utilization=0.2) as engine:  # fmt: skip
        prompt = list(range(20, 52))
        perturb()
        assert await _gap(engine, worker, prompt) > 0.5  # the engine still serves the old weights
        first = await sync("cuda_ipc")  # load_weights, then the fast path is verified
        assert not first.direct
        assert await _gap(engine, worker, prompt) < 0.1  # bf16 engine vs bf16-compute trainer
        perturb()
        second = await sync("cuda_ipc")  # the verified direct copies
        assert second.direct and second.num_bytes == first.num_bytes
        assert await _gap(engine, worker, prompt) < 0.1
        sums_direct = await engine.weight_sums(names)
        await sync("file")  # the same weights through load_weights
        assert await engine.weight_sums(names) == sums_direct
        # sleep level 2 drops the weights; the sync after waking them is all they need (the
        # trainer's sync mode does this every step), and the fast path's views still hold
        await engine.sleep(2)
        await engine.wake_up(["weights"])
        assert (await sync("cuda_ipc")).direct
        await engine.wake_up(["kv_cache"])
        assert await engine.weight_sums(names) == sums_direct
        assert await _gap(engine, worker, prompt) < 0.1


async def test_a_sync_in_chunks_holds_one_packed_chunk_of_extra_memory(
    tiny_model_dir: Path,
) -> None:
    """A sync of a model several times larger than a chunk, each weight a new tensor (cast to
    the engine's dtype as it is read, as a multi-rank gather makes them): the trainer's peak
    extra memory is the chunk's buffer and the two tensors in flight (the one being packed and
    the next one read), not a chunk of tensors next to their packed copy. Handed the live
    parameters (the trainer's sync on one rank), it is the buffer alone."""
    from agentloop.engines.vllm import VLLMEngine
    from agentloop.engines.vllm_ext import checkpoint_shapes
    from agentloop.engines.weight_chunks import ChunkPlan
    from agentloop.trainers.worker import PolicyWorker, WorkerConfig

    chunk = 1 << 20
    worker = PolicyWorker(tiny_model_dir, WorkerConfig(device="cuda", dtype="bfloat16"))
    prompt = list(range(20, 52))
    async with VLLMEngine.create(tiny_model_dir, dtype="bfloat16", max_model_len=512,
                                 gpu_memory_utilization=0.2,
                                 weight_chunk_bytes=chunk) as engine:  # fmt: skip
        dtype = engine.weight_dtype
        sizes = [t.numel() * 2 for _, t in worker.state_dict_for_inference(dtype=dtype)]
        capacity = ChunkPlan.for_checkpoint(checkpoint_shapes(tiny_model_dir), chunk).capacity(2)
        assert sum(sizes) > 4 * capacity
        in_flight = max(a + b for a, b in zip(sizes, [*sizes[1:], 0], strict=True))
        # the second sync of each takes the direct copies
        for cast, bound in ((dtype, capacity + in_flight), (dtype, capacity + in_flight),
                            (None, capacity), (None, capacity)):  # fmt: skip
            _perturb(worker)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            stats = await engine.update_weights(worker.state_dict_for_inference(dtype=cast))
            peak = torch.cuda.max_memory_allocated() - before
            assert stats.chunks > 4 and stats.num_bytes == sum(sizes)
            assert peak <= bound + 511, (cast, peak, capacity, in_flight)  # 512-byte blocks
            assert await _gap(engine, worker, prompt) < 0.1
        assert stats.direct


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("chunk_bytes", [1 << 30, 1 << 20], ids=["one-chunk", "1MiB-chunks"])
async def test_a_tensor_parallel_engine_takes_the_trainers_weights(
    tiny_model_dir: Path, chunk_bytes: int
) -> None:
    """vLLM with ``tensor_parallel_size=2`` next to a trainer on GPU 0: each transport reaches
    both shards (the CUDA IPC buffer lives on GPU 0; the second worker opens it by UUID). In
    1 MiB chunks, a chunk of replicated tensors (the final norm) takes the direct copies from the
    second sync on, on both GPUs."""
    from agentloop.engines.vllm import VLLMEngine
    from agentloop.trainers.worker import PolicyWorker, WorkerConfig

    worker = PolicyWorker(tiny_model_dir, WorkerConfig(device="cuda", dtype="bfloat16"))
    prompt = list(range(20, 52))
    base = [t.detach().clone() for t in _locals(worker)]
    engine = VLLMEngine.create(tiny_model_dir, dtype="bfloat16", max_model_len=512,
                               gpu_memory_utilization=0.2, tensor_parallel_size=2,
                               weight_chunk_bytes=chunk_bytes)  # fmt: skip
    async with engine:
        for transport in ("cuda_ipc", "cuda_ipc", "file", "bytes"):
            _perturb(worker, base)
            assert await _gap(engine, worker, prompt) > 0.5  # still the old weights
            stats = await engine.update_weights(
                worker.state_dict_for_inference(), transport=transport
            )
            assert (stats.chunks > 1) == (chunk_bytes < 1 << 30), stats
            assert not stats.direct  # sharded parameters: never all plain copies
            assert await _gap(engine, worker, prompt) < 0.1, transport


class _Chat(Env):
    """Answers every reply with a user turn for ``TURNS`` turns: multi-turn with no tools."""

    def __init__(self) -> None:
        self.turn = 0

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        task = (options or {})["task"]
        return [Message("user", task.data["prompt"])], {}

    async def step(self, action: Message) -> StepResult:
        self.turn += 1
        done = self.turn >= TURNS
        obs = [] if done else [Message("user", f"Go on ({self.turn}).")]
        return StepResult(obs, float(done), done, False, {})


async def test_multi_turn_rollouts_are_token_exact_on_cuda(
    tiny_model_dir: Path, tokenizer: Any
) -> None:
    from agentloop.engines.vllm import VLLMEngine

    calls: dict[str, list[tuple[tuple[int, ...], Completion]]] = {}

    class Recording(VLLMEngine):
        async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                           session_id: str | None = None) -> Completion:  # fmt: skip
            out = await super().generate(prompt_ids, sampling, session_id=session_id)
            calls.setdefault(session_id or "", []).append((tuple(prompt_ids), out))
            return out

    builder = TokenBuilder(tokenizer)
    tasks = [Task(f"t{i}", {"prompt": f"Count to {i}."}) for i in range(32)]
    config = RolloutConfig(max_turns=TURNS, max_prompt_len=128, max_response_len=384)
    engine = Recording.create(tiny_model_dir, dtype="bfloat16", max_model_len=512,
                              gpu_memory_utilization=0.2)  # fmt: skip
    async with engine:
        groups = await collect(tasks, lambda: _Chat(), engine, builder, config=config,
                               group_size=4, concurrency=128)  # fmt: skip
    multi = 0
    for group in groups:
        for t in group.trajectories:
            turns = calls[f"{t.task_id}#{t.sample_index}"]
            multi += len(turns) > 1
            for turn, (given, out) in zip(t.turns, turns, strict=True):
                assert t.token_ids[: turn.start] == given  # the prefix vLLM was given, exactly
                end = turn.start + len(out.token_ids)
                assert t.token_ids[turn.start : end] == out.token_ids
                assert t.logprobs[turn.start : end] == out.logprobs
                assert all(t.loss_mask[turn.start : end])
            assert sum(t.loss_mask) == sum(len(out.token_ids) for _, out in turns)
    assert multi > 0, "no episode had more than one turn"
