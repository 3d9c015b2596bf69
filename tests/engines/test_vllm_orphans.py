"""`agentloop eval` on vLLM killed with SIGKILL: its vLLM processes die too; a resume against
weights replaced at the same path is refused, naming both fingerprints."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from waits import eventually

from agentloop.checksums import model_fingerprint
from agentloop.cli import main

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow]

ENV = "agentloop/Calc-v0"
ENGINE_ARGS = ["dtype=\"float32\"", "kv_cache_memory_bytes=134217728", "enforce_eager=true",
               "max_num_seqs=8"]  # fmt: skip


def eval_args(model: Path, out: Path) -> list[str]:
    args = ["eval", "--env", ENV, "--model", str(model), "--out", str(out), "--engine", "vllm",
            "--quiet", "--n", "4", "--num-tasks", "16", "--max-turns", "2",
            "--max-response-len", "32", "--max-prompt-len", "480",
            "--concurrency", "2"]  # fmt: skip
    for arg in ENGINE_ARGS:
        args += ["--engine-arg", arg]
    return args


def vllm_descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [p for p in proc.children(recursive=True) if p.name().startswith("VLLM")]
    except psutil.Error:
        return []


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def replace_weights(model: Path) -> None:
    from safetensors.torch import load_file, save_file

    (weights,) = model.glob("*.safetensors")
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 0.01  # another model, same files and names
    save_file(tensors, weights, metadata={"format": "pt"})


async def test_killing_an_eval_takes_its_vllm_down_and_resume_checks_the_weights(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, out = tmp_path / "model", tmp_path / "run"
    shutil.copytree(tiny_model_dir, model)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "agentloop.cli", *eval_args(model, out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    owner = psutil.Process(proc.pid)
    engine: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        path = out / "trajectories.jsonl"
        while not (path.exists() and path.read_bytes().count(b"\n") >= 1):
            assert proc.poll() is None, f"eval exited: {proc.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "eval wrote no trajectory in 300 s"
            time.sleep(0.1)
        engine = vllm_descendants(owner)
        assert engine, "eval runs no VLLM:: process"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        await eventually(lambda: not alive(engine), timeout=60)
    finally:
        proc.kill()
        proc.wait()
        for p in alive(engine):  # never leave an engine behind, even when the test fails
            p.kill()

    recorded = json.loads((out / "config.json").read_text())["model_fingerprint"]
    replace_weights(model)
    assert await asyncio.to_thread(main, [*eval_args(model, out), "--resume"]) == 2
    err = capsys.readouterr().err
    now = model_fingerprint(model)
    assert now is not None and now != recorded
    assert recorded in err and now in err and "the weights were replaced" in err
