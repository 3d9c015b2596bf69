"""Agents written with agent frameworks earn reward 1 on a real engine: `agentloop eval` of the
OpenAI Agents SDK agent (its default model class, ``OpenAIResponsesModel``: ``/v1/responses``) and
of a LangChain agent (``ChatOpenAI``: chat completions) on ``model.path: tiny-calc``, the demo's
cold start, which copies the tool's result into its answer often enough to solve Calc tasks.

The Calc tool caller of tests/engines/test_vllm_agent.py writes tool calls but rarely copies
their results right, so its episodes score 0; the suite's short demo (the ``demo_run`` fixture,
lane b) publishes ``tiny-calc``, so this module runs beside it and builds nothing. The engine
``agentloop eval`` starts is recorded at vLLM's ``AsyncLLM.generate``: a rewarded episode is two
engine requests (the tool call, then the answer), its trajectory is what vLLM was given and
sampled, and every sampled id is trained (mask 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from short_demo import DemoRun
from test_vllm_agent import _assert_token_exact, _episode_calls
from vllm_calls import by_session, recording_started_engines

from agentloop.cli import main
from agentloop.io import read_jsonl, trajectory_from_dict

AGENTS = ("agents_sdk_calc_agent", "langchain_calc_agent")
#: Held-out Calc tasks each agent plays, greedy, with the demo's two-digit first operands.
NUM_TASKS = 16


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(3600)  # the demo fixture included, when this test builds it
@pytest.mark.parametrize("agent", AGENTS)
def test_a_framework_agent_on_tiny_calc_earns_reward_1_in_two_engine_requests(
    agent: str, demo_run: DemoRun, tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    spec = f"agentloop.testing.framework_agents:{agent}"
    args = ["eval", "--env", "agentloop/Agent-v0", "--env-arg", f"agent={spec}", "--env-arg",
            'tasks_kwargs={"digits": 2}', "--model",
            "tiny-calc", "--engine", "vllm", "--out", str(out), "--n", "1", "--num-tasks",
            str(NUM_TASKS), "--temperature", "0", "--max-turns", "3", "--max-prompt-len", "384",
            "--max-response-len", "80", "--quiet"]  # fmt: skip
    for arg in ['dtype="float32"', "kv_cache_memory_bytes=134217728", "enforce_eager=true",
                "max_num_seqs=16"]:  # fmt: skip
        args += ["--engine-arg", arg]
    with recording_started_engines(monkeypatch) as recorded:
        assert main(args) == 0
    [calls] = recorded  # one engine, started once
    trajs = [trajectory_from_dict(r) for r in read_jsonl(out / "trajectories.jsonl")]
    assert json.loads((out / "summary.json").read_text())["episodes"] == NUM_TASKS
    _assert_token_exact(trajs, calls, tokenizer, min_gaps=1)
    sessions = by_session(calls)
    rewarded = [t for t in trajs if t.reward == 1.0]
    assert rewarded, [t.messages[-1].content for t in trajs]
    for t in rewarded:
        assert [turn.tool_calls for turn in t.turns] == [1, 0], t.turns  # a call, the answer
        assert len(_episode_calls(t, sessions)) == 2
        sampled = sum(len(c.returned) for c in _episode_calls(t, sessions))
        assert t.num_trained_tokens == sampled  # every sampled id under mask 1
