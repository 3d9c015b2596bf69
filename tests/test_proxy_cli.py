"""The proxy through the commands users run: `agentloop eval` on an openai-SDK agent
(AgentEnv) and `agentloop serve-proxy` for agents that run elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import openai
import pytest

from agentloop.cli import main
from agentloop.io import read_jsonl, trajectory_from_dict

AGENT = "agent=agentloop.testing.calc_agent:calc_agent"


@pytest.mark.slow  # the HF engine generates every turn on the CPU
def test_eval_cli_plays_an_sdk_agent(calc_caller_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["eval", "--env", "agentloop/Agent-v0", "--env-arg", AGENT, "--model",
            str(calc_caller_dir), "--engine", "hf", "--out", str(out), "--n", "2",
            "--num-tasks", "2", "--max-turns", "4", "--max-prompt-len", "512",
            "--max-response-len", "160", "--quiet"]  # fmt: skip
    assert main(args) == 0
    trajs = [trajectory_from_dict(r) for r in read_jsonl(out / "trajectories.jsonl")]
    assert len(trajs) == 4 and not any(t.failed for t in trajs), [t.error for t in trajs]
    assert any(t.turns[0].tool_calls for t in trajs)  # the tool caller called, the agent ran it
    for t in trajs:
        assert t.metrics["segments"] == 1.0
        for a, b in zip(t.turns, t.turns[1:], strict=False):  # tool results between turns: mask 0
            assert set(t.loss_mask[a.start + a.completion_tokens : b.start]) == {0}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 4


@pytest.mark.slow  # a fresh process importing torch and transformers
def test_serve_proxy_records_an_episode(tiny_model_dir: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "agentloop.cli", "serve-proxy", "--model", str(tiny_model_dir),
           "--engine", "hf", "--port", "0", "--served-model", "tiny"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
    )
    try:
        assert proc.stdout is not None
        line = ""
        for line in proc.stdout:  # ends when the process exits: no hang if it fails to start
            if line.startswith("serving "):
                break
        assert line.startswith("serving "), line
        url = line.split(" on ")[-1].strip()
        client = openai.OpenAI(base_url=url, api_key="episode-1", max_retries=0)
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
        assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= 5
        with pytest.raises(openai.NotFoundError, match="serves 'tiny'"):
            client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "x"}]
            )
        root = url.removesuffix("/v1")
        with urllib.request.urlopen(f"{root}/episodes/episode-1") as response:
            recorded = json.loads(response.read())
        [segment] = recorded["segments"]
        n = reply.usage.prompt_tokens
        assert (
            segment["prompt_len"] == n
            and sum(segment["loss_mask"]) == reply.usage.completion_tokens
        )
        assert len(segment["token_ids"]) == n + reply.usage.completion_tokens
    finally:
        proc.terminate()
        proc.wait(30)
