"""`agentloop train` whose sandbox server dies after start-up stops after N failed steps."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from async_helpers import overrides
from grpo_helpers import TrainCLI

from agentloop.trainers.metrics import read_metrics

pytest.importorskip("vllm")


@pytest.mark.timeout(1500)
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_run_whose_sandbox_dies_stops_after_n_failed_steps_with_the_error(
    train_cli: TrainCLI, calc_caller_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server passes the start-up check, then is killed: every python call of the next
    steps is a tool error, and after ``trainer.max_failed_steps=2`` such steps the run exits 2
    naming the server, instead of training on failures to the last step.

    As a user sets it up: a custom env named ``module:id`` (the module registers it) whose
    sandbox is a remote pool given as a mapping in the run's YAML."""
    (tmp_path / "pool_envs.py").write_text(
        "from agentloop.envs import CalcEnv, register\nregister('me/PoolCalc-v0', CalcEnv)\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    argv = [sys.executable, "-m", "agentloop.cli", "serve-sandbox", "--backend", "local",
            "--port", "0", "--pool-size", "1"]  # fmt: skip
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        found = re.search(r"(http://127\.0\.0\.1:\d+)\s*$", server.stdout.readline())
        assert found, "serve-sandbox printed no address"
        url = found.group(1)
        out, log = tmp_path / "run", tmp_path / "train.log"
        config = tmp_path / "run.yaml"
        config.write_text(
            "data:\n  env: pool_envs:me/PoolCalc-v0\n  env_kwargs:\n    sandbox:\n"
            f"      backend: remote\n      urls: [{url}]\n      retries: 1\n"
        )
        args = [
            str(config),
            *overrides(
                calc_caller_dir,
                out,
                "trainer.total_steps=6",
                "trainer.max_failed_steps=2",
                "rollout.max_response_len=160",
                "rollout.max_prompt_len=512",
                "rollout.max_tool_output_tokens=64",
                "checkpoint.every=0",
                "checkpoint.save_final=false",
                "actor.lr=1e-7",
                "actor.entropy_coef=0.0",
            ),
        ]  # fmt: skip  (it stays a caller)
        proc = train_cli.spawn(args, log)
        deadline = time.monotonic() + 600
        while "model " not in log.read_text():  # printed once the env's sandbox was checked
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the run never got past its start-up checks"
            time.sleep(0.1)
        server.send_signal(signal.SIGKILL)
        assert proc.wait(900) == 2, log.read_text()[-3000:]
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(30)
    text = log.read_text()
    assert "stopping at step 2: the rollouts of the last 2 steps all failed" in text, text[-3000:]
    assert f"sandbox server {url}" in text
    metrics = read_metrics(out)
    assert sorted(metrics) == [1, 2]  # the failing steps' metrics are kept; no step 3
    assert all(m["rollout/failed_frac"] > 0 for m in metrics.values())
    # the pool's metrics: its one server is down, and the calls that hit it are counted
    assert metrics[2]["sandbox/servers_up"] == 0.0 and metrics[2]["sandbox/errors"] > 0
    assert metrics[2]["tools/abandoned_running"] == 0.0  # no call outlived its deadline
