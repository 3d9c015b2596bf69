"""The proxy through the commands users run: `agentloop eval` on an openai-SDK agent
(AgentEnv), its trajectories checked token-exact against the model, the same for an agent that
edits its history (segments), and `agentloop serve-proxy` for agents that run elsewhere. (The
same `eval` on vLLM, recorded at vLLM's own boundary, is in tests/engines/test_vllm_agent.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import openai
import pytest

from agentloop.chat import TokenBuilder
from agentloop.cli import main
from agentloop.engines.hf import HFEngine
from agentloop.io import read_jsonl, trajectory_from_dict
from agentloop.testing.calc_agent import CALC_TOOLS
from agentloop.types import Completion, Trajectory

AGENT = "agent=agentloop.testing.calc_agent:calc_agent"
EDITING_AGENT = "agent=agentloop.testing.calc_agent:editing_calc_agent"


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
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 4
    assert all(t.metrics["segments"] == 1.0 for t in trajs)
    _assert_token_exact(trajs, calc_caller_dir)


@pytest.mark.slow  # the HF engine generates every turn on the CPU
def test_eval_cli_plays_a_history_editing_agent_in_segments(
    calc_caller_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent edits its first message after its tool call, so its second request starts a
    segment: every episode is 2 trajectories with the segment metric, and every call the HF
    engine answered is trained in exactly one of them (nothing trained twice, nothing lost)."""
    calls: list[tuple[str, tuple[int, ...], Completion]] = []  # (session, prompt ids, sample)
    real_generate = HFEngine.generate

    async def recording_generate(
        self: HFEngine, prompt_ids: Any, sampling: Any, **kw: Any
    ) -> Completion:
        completion = await real_generate(self, prompt_ids, sampling, **kw)
        calls.append((kw["session_id"], tuple(prompt_ids), completion))
        return completion

    monkeypatch.setattr(HFEngine, "generate", recording_generate)
    out = tmp_path / "run"
    # seed 5: every episode's first reply calls the tool and its second answers (2 segments)
    args = ["eval", "--env", "agentloop/Agent-v0", "--env-arg", EDITING_AGENT, "--model",
            str(calc_caller_dir), "--engine", "hf", "--out", str(out), "--n", "2",
            "--num-tasks", "2", "--max-turns", "4", "--max-prompt-len", "512",
            "--max-response-len", "160", "--seed", "5", "--quiet"]  # fmt: skip
    assert main(args) == 0
    trajs = [trajectory_from_dict(r) for r in read_jsonl(out / "trajectories.jsonl")]
    assert not any(t.failed for t in trajs), [t.error for t in trajs]
    assert json.loads((out / "summary.json").read_text())["episodes"] == 4  # not 8 segments
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tool_calls_per_episode"] > 0  # the calls are in segment 0: all segments count
    assert summary["mean_turns"] == 2.0  # one turn per segment
    episodes: dict[tuple[str, int], list[Trajectory]] = defaultdict(list)
    for t in trajs:
        episodes[(t.task_id, t.sample_index)].append(t)
    assert len(episodes) == 4
    for segments in episodes.values():
        segments.sort(key=lambda t: t.metrics["segment_index"])
        assert [t.metrics["segment_index"] for t in segments] == [0.0, 1.0]
        assert all(t.metrics["segments"] == 2.0 for t in segments)
        first, second = segments
        assert first.turns[-1].tool_calls and not second.turns[-1].tool_calls
        # the edited first message: the second segment is a fresh render, not an extension
        assert second.token_ids[: first.prompt_len] != first.token_ids[: first.prompt_len]
    assert len(calls) == len(trajs)  # one engine call per segment here
    for session, prompt, completion in calls:
        k, n = len(prompt), len(completion.token_ids)
        episode = [t for t in trajs if session.startswith(f"{t.task_id}#{t.sample_index}-")]
        hits = [t for t in episode if t.token_ids[:k] == prompt
                and t.token_ids[k : k + n] == completion.token_ids
                and t.loss_mask[k : k + n] == (1,) * n]  # fmt: skip
        assert len(hits) == 1, f"an engine call is trained in {len(hits)} segments"
        assert hits[0].logprobs[k : k + n] == completion.logprobs
    assert sum(t.num_trained_tokens for t in trajs) == sum(len(c.token_ids) for *_, c in calls)
    _assert_token_exact(trajs, calc_caller_dir)


def _assert_token_exact(trajs: list[Trajectory], model_dir: Path) -> None:
    """The written trajectories are what the HF engine was given and sampled: the ids render
    the conversation through the chat template, the model's logprobs recomputed on the stored
    ids (one forward pass, temperature 1 as sampled) are the stored ones at every sampled
    token, and every token between two turns (the agent's tool results) is mask 0, logprob 0."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    builder = TokenBuilder(tokenizer, tools=CALC_TOOLS)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for t in trajs:
        builder.check_text(t.token_ids, t.messages)  # raises on any difference
        sampled = [i for i, m in enumerate(t.loss_mask) if m]
        assert len(sampled) == sum(turn.completion_tokens for turn in t.turns)
        for turn in t.turns:  # each turn's sample is one run of mask 1 from its start
            assert (
                t.loss_mask[turn.start : turn.start + turn.completion_tokens]
                == (1,) * turn.completion_tokens
            )
        for a, b in zip(t.turns, t.turns[1:], strict=False):  # tool results between turns
            gap = slice(a.start + a.completion_tokens, b.start)
            assert set(t.loss_mask[gap]) == {0} and set(t.logprobs[gap]) == {0.0}
            assert "<tool_response>" in tokenizer.decode(list(t.token_ids[gap]))
        with torch.no_grad():
            logits = model(torch.tensor([t.token_ids])).logits[0].float()
        ids = torch.tensor(t.token_ids)
        lp = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[1:, None])[:, 0].tolist()
        worst = max(abs(lp[i - 1] - t.logprobs[i]) for i in sampled)
        assert worst < 1e-4, f"{t.task_id}: stored logprobs differ from the model's by {worst}"


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
