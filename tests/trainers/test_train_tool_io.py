"""Tool I/O record/replay and ``data.tools`` through ``agentloop train`` (YAML + key=value).

A one-step run of the tiny Calc tool caller records its tool calls (validation before training
included); the same run replayed with the sandbox unusable and misses failing gets the recorded
tool outputs: the same episodes, the same calls, no error. ``data.tools`` is checked at load
and reaches the run's env (a server that cannot be listed stops the run at start, named).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from async_helpers import overrides
from grpo_helpers import TrainMain

from agentloop.errors import ConfigError
from agentloop.io import read_jsonl
from agentloop.tools.recording import read_tape

#: The record run: Calc with the in-process fake sandbox, validation before the one step.
RECORD_YAML = """\
data:
  env: agentloop/Calc-v0
  env_kwargs: {sandbox: fake}
  num_val_tasks: 2
trainer:
  total_steps: 1
  val_before_train: true
rollout:
  tools_record: TAPE
"""
#: One step of 2 prompts × 2 samples, nothing saved but the trajectories.
SHORT = ("trainer.prompts_per_step=2", "rollout.n=2", "rollout.max_turns=3",
         "rollout.max_response_len=160", "rollout.max_prompt_len=512",
         "rollout.max_tool_output_tokens=64", "checkpoint.every=0",
         "checkpoint.save_final=false", "trainer.total_steps=1")  # fmt: skip
SERVER = Path(__file__).parents[1] / "tools" / "mcp_server.py"


def _calls(tape: Path) -> list[tuple[Any, ...]]:
    fields = ("task_id", "sample_index", "turn", "call_index", "tool", "content", "error_kind")
    return sorted((*(r[f] for f in fields), json.dumps(r["arguments"])) for r in read_tape(tape))


def _episodes(path: Path) -> dict[tuple[str, int], tuple[Any, ...]]:
    fields = ("token_ids", "reward", "stop_reason")
    rows = read_jsonl(path)
    return {(r["task_id"], r["sample_index"]): tuple(r[f] for f in fields) for r in rows}


def _tool_outputs(path: Path) -> list[str]:
    return [m["content"] for r in read_jsonl(path) for m in r["messages"] if m["role"] == "tool"]


@pytest.mark.timeout(1500)
def test_a_replayed_training_run_gets_the_recorded_tool_outputs_without_the_sandbox(
    train_main: TrainMain, calc_caller_dir: Path, tmp_path: Path
) -> None:
    tape, again = tmp_path / "tape", tmp_path / "tape-again"
    config = tmp_path / "run.yaml"
    config.write_text(RECORD_YAML.replace("TAPE", str(tape)))
    record = [str(config), *overrides(calc_caller_dir, tmp_path / "a", *SHORT)]
    assert train_main(record, tmp_path / "a.log") == 0, _tail(tmp_path / "a.log")
    recorded = _calls(tape)
    assert recorded and all(c[6] is None for c in recorded), recorded  # the sandbox answered

    # The replay: Calc's sandbox is the remote backend with no server (its start-up check and
    # every call would fail), a call not in the recording fails the run; it records as well.
    replay = [*record, "data.env_kwargs.sandbox=remote",
              f"trainer.out_dir={tmp_path / 'b'}", f"rollout.tools_replay={tape}",
              "rollout.tools_replay_miss=fail", f"rollout.tools_record={again}"]  # fmt: skip
    assert train_main(replay, tmp_path / "b.log") == 0, _tail(tmp_path / "b.log")
    assert _calls(again) == recorded  # every call was served from the recording, none missed
    for part in ("trajectories/step_000001.jsonl", "val/step_000000/trajectories.jsonl"):
        a, b = tmp_path / "a" / part, tmp_path / "b" / part
        assert _episodes(b) == _episodes(a), part
        assert _tool_outputs(b) == _tool_outputs(a) and _tool_outputs(a), part
    assert "tools_replay_miss: fail" in (tmp_path / "b" / "config.yaml").read_text()


@pytest.mark.timeout(900)
def test_a_training_run_calls_the_mcp_server_of_data_tools(
    train_main: TrainMain, calc_caller_dir: Path, tmp_path: Path
) -> None:
    """``data.tools`` names an MCP server (stdio, with options) whose ``python`` tool replaces
    Calc's; Calc's own sandbox is unusable (remote, no server), so every answer is the server's."""
    spec = "mcp[max_concurrency=2,timeout_s=60,replace=python]:" + shlex.join(
        [sys.executable, str(SERVER), "--only", "python"]
    )
    config = tmp_path / "run.yaml"
    config.write_text("data:\n  env: agentloop/Calc-v0\n  env_kwargs: {sandbox: remote}\n"
                      f"  tools: [{json.dumps(spec)}]\n")  # fmt: skip
    args = [str(config), *overrides(calc_caller_dir, tmp_path / "run", *SHORT)]
    log = tmp_path / "run.log"
    assert train_main(args, log) == 0, _tail(log)
    step = tmp_path / "run" / "trajectories" / "step_000001.jsonl"
    answered = [o for o in _tool_outputs(step) if not o.startswith("Error")]
    assert answered and any(ch.isdigit() for o in answered for ch in o), _tool_outputs(step)
    failures = ("tool_error/tool_exception", "tool_error/timeout")  # the server, or its session
    metrics = [r["metrics"] for r in read_jsonl(step)]
    assert not [m for m in metrics if any(k in m for k in failures)], metrics
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["data"]["tools"] == [spec]  # the run's config records the spec, options too


def _tail(log: Path) -> str:
    return log.read_text()[-3000:]


def test_data_tools_are_checked_when_the_config_loads(tmp_path: Path) -> None:
    from agentloop.trainers.config import TrainConfig, load_config

    config = tmp_path / "run.yaml"
    config.write_text("data:\n  tools: ['mcp:python server.py']\n")
    assert load_config(TrainConfig, config).data.tools == ["mcp:python server.py"]
    bad = ["data.tools=[mcp:http://127.0.0.1:1/mcp,python server.py]"]
    with pytest.raises(ConfigError, match=r"data\.tools\[1\]='python server\.py'.*mcp:COMMAND"):
        load_config(TrainConfig, config, bad)
    # options, as eval --tools takes them: in brackets after mcp
    config.write_text("data:\n  tools: ['mcp[max_concurrency=2,timeout_s=10]:python server.py']\n")
    assert load_config(TrainConfig, config).data.tools[0].startswith("mcp[max_concurrency=2,")
    config.write_text("data:\n  tools: ['mcp:python a.py', 'mcp[max_concurency=2]:python b.py']\n")
    with pytest.raises(ConfigError, match=r"data\.tools\[1\]='mcp\[max_concurency=2\]:python "
                       r"b\.py': .*Did you mean 'max_concurrency'\?"):  # fmt: skip
        load_config(TrainConfig, config)


@pytest.mark.slow  # `agentloop train` (in this process), stopped before any engine
def test_a_data_tools_server_that_cannot_start_stops_the_run_named(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentloop.cli import main

    spec = f"mcp:{sys.executable} {tmp_path / 'missing_server.py'}"
    config = tmp_path / "run.yaml"
    config.write_text(f"data:\n  tools: [{json.dumps(spec)}]\n")
    args = [str(config), f"trainer.out_dir={tmp_path / 'run'}", f"model.path={tiny_model_dir}"]
    status, out = main(["train", *args]), capsys.readouterr()
    assert status == 2, out.out[-2000:] + out.err[-2000:]
    assert "cannot list the tools of MCP server" in out.err
    assert "missing_server.py" in out.err
    # the run's config records the tools it was given
    assert spec in (tmp_path / "run" / "config.yaml").read_text()
