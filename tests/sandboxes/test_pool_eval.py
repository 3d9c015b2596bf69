"""`agentloop eval` on a pool of two real `agentloop serve-sandbox` servers: spread, a kill, bad
settings at start-up; and the eval's exit status when the engine or the sandbox is dead."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sbx_helpers import needs_bwrap

from agentloop.cli import main
from agentloop.io import read_jsonl

TOKEN = "pool-eval-t0ken"
ENV = "agentloop/Calc-v0"
SMALL = ["--max-turns", "3", "--max-response-len", "160", "--max-prompt-len", "512", "--quiet"]


def _free_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


class Server:
    """``agentloop serve-sandbox`` (bubblewrap backend) in a subprocess."""

    def __init__(self, token: str) -> None:
        argv = [sys.executable, "-m", "agentloop.cli", "serve-sandbox", "--backend", "local",
                "--port", "0", "--pool-size", "1"]  # fmt: skip
        env = {**os.environ, "AGENTLOOP_SANDBOX_TOKEN": token}  # never on the command line
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+)\s*$", line)
        assert found, f"serve-sandbox printed {line!r}"
        self.url = found.group(1)

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


@pytest.fixture
def two_servers() -> Iterator[list[Server]]:
    servers = [Server(TOKEN), Server(TOKEN)]
    yield servers
    for s in servers:
        s.stop()


def _eval(model: Path, out: Path, sandbox: Any, *extra: str) -> list[str]:
    return ["eval", "--env", ENV, "--model", str(model), "--out", str(out), "--engine", "hf",
            "--env-arg", f"sandbox={json.dumps(sandbox)}", *SMALL, *extra]  # fmt: skip


def _eval_killing_a_mid_call(model: Path, out: Path, a: Server, b: Server) -> bool:
    """Run the pool eval; once episodes are done and server ``a`` is running a call, SIGKILL it.
    The eval must exit 0; returns whether the kill came before the eval had finished."""
    sandbox = {"backend": "remote", "urls": [a.url, b.url], "token_env": "POOL_EVAL_TOKEN",
               "retries": 1, "backoff_s": 0.05}  # fmt: skip
    args = _eval(model, out, sandbox, "--n", "2", "--num-tasks", "4", "--concurrency", "4")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "POOL_EVAL_TOKEN": TOKEN}
    argv = [sys.executable, "-m", "agentloop.cli", *args]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    path, killed = out / "trajectories.jsonl", False
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and not killed:
            assert time.monotonic() < deadline, "the eval made no progress on the pool"
            if path.exists() and path.read_bytes().count(b"\n") >= 2 and a.health()["active"]:
                a.proc.send_signal(signal.SIGKILL)
                killed = True
            time.sleep(0.005)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]
    return killed


@needs_bwrap
@pytest.mark.slow
def test_eval_spreads_over_a_pool_and_loses_no_episode_when_a_server_is_killed(
    two_servers: list[Server], calc_caller_dir: Path, tmp_path: Path
) -> None:
    """Sessions go to both servers; killing one while it runs a call loses no episode: the calls
    that hit it are tool errors naming it, their episodes go on, new sessions go to the other,
    the eval exits 0.

    The kill comes when ``/health`` says a call is running, but that call may finish in the
    millisecond before the signal (and no later call reach the killed server), or the eval may
    end before a call is seen running: such an attempt shows nothing about in-flight calls, so
    the run is repeated (at most three times) until one does."""
    for attempt in range(3):
        a, b = two_servers[-2:]
        out = tmp_path / f"run{attempt}"
        killed = _eval_killing_a_mid_call(calc_caller_dir, out, a, b)
        records = read_jsonl(out / "trajectories.jsonl")
        errors = [m["content"] for r in records for m in r["messages"]
                  if m["role"] == "tool" and str(m["content"]).startswith("Error")]  # fmt: skip
        if killed and errors:
            break
        two_servers += [Server(TOKEN), Server(TOKEN)]  # a fresh pair for the next attempt
    assert errors, "in three attempts no call reached the killed server after its kill"
    assert sorted((r["task_id"], r["sample_index"]) for r in records) == sorted(
        (f"calc-test-{t:06d}", i) for t in range(4) for i in range(2)
    )
    assert all(a.url in e for e in errors), errors  # only the killed server's calls failed
    stops = {r["stop_reason"] for r in records}  # the episodes went on after the tool error
    assert not stops & {"engine_error", "env_error", "tool_fatal", "timeout"}, stops
    (pool,) = json.loads((out / "summary.json").read_text())["sandbox_pools"]
    by_url = {s["url"]: s for s in pool["servers"]}
    assert by_url[a.url]["sessions_opened"] > 0 and by_url[b.url]["sessions_opened"] > 0
    assert by_url[b.url]["up"] and by_url[b.url]["errors"] == 0
    assert not by_url[a.url]["up"] and pool["servers_up"] == 1


@needs_bwrap
@pytest.mark.slow  # two server processes
def test_eval_fails_at_start_up_naming_a_wrong_url_or_token(
    two_servers: list[Server], tiny_model_dir: Path, tmp_path: Path, capsys: Any
) -> None:
    a, b = two_servers
    dead = _free_url()
    wrong_url = {"backend": "remote", "urls": [a.url, dead], "token_env": "POOL_EVAL_TOKEN"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POOL_EVAL_TOKEN", TOKEN)
        assert main(_eval(tiny_model_dir, tmp_path / "r1", wrong_url, "--n", "1")) == 2
        assert f"sandbox server {dead} does not answer" in capsys.readouterr().err
        mp.setenv("POOL_EVAL_TOKEN", "not-the-token")
        wrong_token = {**wrong_url, "urls": [a.url, b.url]}
        assert main(_eval(tiny_model_dir, tmp_path / "r2", wrong_token, "--n", "1")) == 2
        err = capsys.readouterr().err
        for server in (a, b):  # every bad server is named, in the order of the urls
            assert f"sandbox server {server.url} rejected the token (from $POOL_EVAL_TOKEN)" in err
        assert "not-the-token" not in err
    assert not (tmp_path / "r1" / "trajectories.jsonl").exists()  # nothing was played


def test_eval_with_a_dead_engine_exits_non_zero_with_the_stop_reasons(
    tiny_model_dir: Path, tmp_path: Path, capsys: Any
) -> None:
    args = ["eval", "--env", ENV, "--model", str(tiny_model_dir), "--out", str(tmp_path / "run"),
            "--engine", "openai", "--base-url", _free_url() + "/v1", "--env-arg", "sandbox=fake",
            "--n", "2", "--num-tasks", "2", *SMALL]  # fmt: skip
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "4 of 4 episodes failed" in err and "stop reasons: engine_error 4" in err, err
    assert main([*args, "--resume", "--max-failed-share", "1"]) == 0  # the threshold is a flag


def test_eval_whose_sandbox_fails_every_run_exits_non_zero(
    calc_caller_dir: Path, tmp_path: Path, capsys: Any
) -> None:
    """The sandbox passes the start-up check, then every run fails (as a server that died
    mid-run): the episodes end normally, but their tool calls failed for the service."""
    dead = json.dumps({"backend": "fake", "fail_after": 0})
    args = ["eval", "--env", ENV, "--model", str(calc_caller_dir), "--out", str(tmp_path / "run"),
            "--engine", "hf", "--env-arg", f"sandbox={dead}", "--n", "1", "--num-tasks", "2",
            "--temperature", "0", *SMALL, "--max-turns", "2"]  # fmt: skip
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "2 of 2 episodes failed" in err and "2 with failed tool calls" in err, err
    assert "tool: Error: tool 'python'" in err, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["tool_failed"] == 2 and summary["tool_errors"]["tool_exception"] > 0
