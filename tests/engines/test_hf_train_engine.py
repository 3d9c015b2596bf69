"""HFEngine as a training run's engine (``engine.backend: hf``): weight updates by checkpoint
name, policy versions on every sampled token, interrupted requests resumed on the new weights.

Real transformers generation on the tiny model; no vLLM.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from agentloop.engines.base import SamplingParams, TrainEngine
from agentloop.engines.hf import HFEngine
from agentloop.errors import ConfigError, InferenceError

PROMPT = [7, 8, 9, 10, 11]


@pytest.fixture
def engine(tiny_model_dir: Path) -> HFEngine:
    engine = HFEngine.from_pretrained(tiny_model_dir)
    engine.stop_token_ids = ()  # sample to max_tokens: the tests decide when a request ends
    return engine


def perturbed(engine: HFEngine, scale: float) -> list[tuple[str, torch.Tensor]]:
    """Every weight of ``engine`` plus ``scale``, by checkpoint name (what a trainer sends)."""
    return [(n, p.detach() + scale) for n, p in engine.model.named_parameters()]


def after_forwards(engine: HFEngine, n: int) -> threading.Event:
    """An event set once the model has run ``n`` forward passes (the prompt's, then one per
    sampled token): a request is then running, between two tokens."""
    forwards = 0
    event = threading.Event()

    def count(*_: Any) -> None:
        nonlocal forwards
        forwards += 1
        if forwards == n:
            event.set()

    engine.model.register_forward_hook(count)
    return event


def sampling(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, banned_token_ids=(0, 1, 2))  # no special token


def test_the_hf_engine_is_a_train_engine(engine: HFEngine) -> None:
    assert isinstance(engine, TrainEngine)
    assert engine.pids == () and engine.version == 0 and engine.weight_dtype == torch.float32


async def test_an_update_loads_the_weights_and_tags_later_tokens_with_its_version(
    engine: HFEngine,
) -> None:
    before = await engine.generate(PROMPT, sampling(4))
    assert before.versions == (0, 0, 0, 0)
    new = perturbed(engine, 0.01)
    stats = await engine.update_weights(iter(new), version=3)
    assert stats.num_tensors == len(new) > 0
    assert stats.num_bytes == sum(t.numel() * t.element_size() for _, t in new)
    for (name, want), (_, got) in zip(new, engine.model.named_parameters(), strict=True):
        assert torch.equal(got, want), name
    after = await engine.generate(PROMPT, sampling(4))
    assert engine.version == 3 and after.versions == (3, 3, 3, 3)


async def test_an_interrupting_update_resumes_the_running_request_on_the_new_weights(
    engine: HFEngine,
) -> None:
    """The request is stopped at a token boundary once the update starts, keeps its tokens,
    and finishes its max_tokens under version 1: one completion, two runs of versions."""
    sampled_some = after_forwards(engine, 5)
    request = asyncio.create_task(engine.generate(PROMPT, sampling(400)))
    await asyncio.to_thread(sampled_some.wait)
    await engine.update_weights(perturbed(engine, 0.01), version=1, interrupt=True)
    out = await request
    assert len(out.token_ids) == 400 and out.finish_reason == "length"
    first_new = out.versions.index(1)
    assert 4 <= first_new < 400, out.versions
    assert set(out.versions[:first_new]) == {0} and set(out.versions[first_new:]) == {1}


async def test_a_draining_update_waits_for_the_running_request(engine: HFEngine) -> None:
    running = after_forwards(engine, 2)
    request = asyncio.create_task(engine.generate(PROMPT, sampling(40)))
    await asyncio.to_thread(running.wait)
    await engine.update_weights(perturbed(engine, 0.01), version=1)
    out = await request
    assert out.versions == (0,) * 40 and out.finish_reason == "length"


@pytest.mark.parametrize(
    ("pairs", "error", "message"),
    [
        ([], ConfigError, "got no tensors"),
        ([("model.nope.weight", torch.zeros(1))], InferenceError, "'model.nope.weight'"),
        ([("model.norm.weight", torch.zeros(3))], InferenceError, "has shape (3,)"),
    ],
)
async def test_a_bad_update_is_a_named_error(
    engine: HFEngine, pairs: list[tuple[str, torch.Tensor]], error: type, message: str
) -> None:
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        await engine.update_weights(pairs, version=1)
    assert engine.version == 0
    out = await engine.generate(PROMPT, sampling(2))  # the engine still serves
    assert out.versions == (0, 0)
