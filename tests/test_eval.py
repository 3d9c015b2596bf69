"""`agentloop eval`: summary statistics, config hash, a real run, resume after a kill, compare."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentloop.chat import TokenBuilder
from agentloop.cli import main
from agentloop.envs import ToolEnv, make
from agentloop.errors import ConfigError
from agentloop.eval import EvalConfig, config_fingerprint, config_hash, run_eval
from agentloop.eval_report import (
    EvalSummary,
    compare_runs,
    group_episodes,
    print_comparison,
    summarize,
)
from agentloop.io import JsonlWriter, read_jsonl, trajectory_to_dict
from agentloop.rollout import RolloutConfig
from agentloop.tools import tool
from agentloop.types import StopReason, Task, Trajectory

ENV = "agentloop/Calc-v0"
SMALL = ["--max-turns", "2", "--max-response-len", "32", "--max-prompt-len", "512"]


def _traj(task: str, i: int, reward: float, **metrics: float) -> Trajectory:
    return Trajectory(
        task, (1, 2, 3), (0, 1, 1), (0.0, -0.1, -0.2), 1, reward, StopReason.DONE,
        metrics={"tool_calls": 2.0, **metrics}, sample_index=i,
    )  # fmt: skip


def _record(t: Trajectory, key: str | None = None, correct: bool | None = None) -> dict[str, Any]:
    return {**trajectory_to_dict(t), "answer": key, "answer_key": key, "answer_correct": correct}


def test_summarize_hand_computed() -> None:
    records = [
        _record(_traj("a", 0, 0.0, **{"tool_error/timeout": 1.0}), "7", False),
        _record(_traj("a", 1, 0.0), "7", False),
        _record(_traj("a", 2, 1.0), "8", True),
        _record(_traj("a", 3, 0.0)),
        _record(_traj("b", 0, 1.0, **{"tool_error/unknown_tool": 1.0}), "3", True),
        _record(_traj("b", 1, 0.0, **{"tool_error/unknown_tool": 1.0})),
        _record(_traj("b", 2, 1.0), "3", True),
        _record(_traj("b", 3, 0.0), "4", False),
    ]
    s = summarize(group_episodes(records), env=ENV, model="m", split="test", samples_per_task=4,
                  pass_threshold=1.0, config_hash="h")  # fmt: skip
    assert (s.tasks, s.episodes) == (2, 8)
    assert s.reward.mean == pytest.approx(0.375)  # mean of per-task means 0.25 and 0.5
    assert s.reward.n == 2 and s.reward.lo < 0.375 < s.reward.hi
    assert s.pass_at_k[1] == pytest.approx((0.25 + 0.5) / 2)
    assert s.pass_at_k[2] == pytest.approx((0.5 + 5 / 6) / 2)
    assert s.pass_at_k[4] == 1.0
    assert s.majority_at_n == 0.5  # a: majority "7" is wrong; b: majority "3" is right
    assert s.answer_rate == pytest.approx(6 / 8)
    assert s.tool_calls_per_episode == 2.0
    assert s.tool_error_rate == pytest.approx(3 / 16)
    assert s.tool_errors == {
        "timeout": pytest.approx(1 / 16),
        "unknown_tool": pytest.approx(2 / 16),
    }
    assert s.stop_reasons == {"done": 8}
    back = EvalSummary.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s


def test_summary_without_answers_or_ci() -> None:
    records = [trajectory_to_dict(_traj("a", 0, 0.5))]
    s = summarize(group_episodes(records), env=ENV, model="m", split="test", samples_per_task=1,
                  pass_threshold=0.5, config_hash="h")  # fmt: skip
    assert s.majority_at_n is None and s.answer_rate is None
    assert s.pass_at_k == {1: 1.0}
    assert math.isnan(s.reward.lo)
    assert s.to_dict()["reward"]["lo"] is None  # strict JSON: no NaN in summary.json
    with pytest.raises(ConfigError, match="no trajectories"):
        summarize([], env=ENV, model="m", split="t", samples_per_task=1, pass_threshold=1,
                  config_hash="h")  # fmt: skip


def test_calc_answer_hook() -> None:
    from agentloop.types import Message, Task

    hook = make(ENV).answer_hook()
    assert hook is not None
    messages = [Message("user", "q"), Message("assistant", "so \\boxed{1,234}.")]
    assert hook.extract(messages) == "1,234"
    assert hook.normalize("1,234") == hook.normalize("1234") == "1234"
    assert hook.check("1,234", Task("t", {"answer": "1234"}))
    assert hook.extract([Message("assistant", "no box")]) is None


def test_config_hash_covers_what_makes_runs_comparable(
    tokenizer: Any, tiny_model_dir: Path
) -> None:
    env = make(ENV)
    builder = TokenBuilder(tokenizer, tools=env.tool_schemas)
    hook = env.answer_hook()

    def fingerprint(builder: TokenBuilder = builder, **changes: Any) -> dict[str, str]:
        rollout = RolloutConfig(**changes.pop("rollout", {}))
        config = EvalConfig(ENV, str(tiny_model_dir), Path("x"), rollout=rollout, **changes)
        return config_fingerprint(builder, config, hook)

    base = fingerprint()
    assert base == fingerprint(seed=5, n=2, engine="hf", num_tasks=3)  # not part of the hash
    assert fingerprint(rollout={"temperature": 0.7})["sampling"] != base["sampling"]
    assert fingerprint(rollout={"max_turns": 3})["rollout"] != base["rollout"]
    assert fingerprint(env_kwargs={"digits": 4})["env"] != base["env"]
    assert fingerprint(pass_threshold=0.5)["scoring"] != base["scoring"]
    other = TokenBuilder(tokenizer, tools=env.tool_schemas,
                         chat_template=builder.chat_template + "{# v2 #}")  # fmt: skip
    changed = fingerprint(other)
    assert [k for k in base if base[k] != changed[k]] == ["chat_template"]
    assert config_hash(base) != config_hash(changed)
    assert len(config_hash(base)) == 64


def _oracle(tokenizer: Any, answers: dict[str, str]) -> Any:
    """Calls python, then boxes the right answer or, on odd seeds, a wrong one."""
    import re

    from agentloop.engines.fake import FakeEngine

    def respond(prompt_ids: Any, sampling: Any) -> str:
        text = tokenizer.decode(prompt_ids)
        answer = answers[re.findall(r"user\n(.*?)<\|im_end\|>", text)[0]]
        if "<tool_response>" not in text:
            call = {"name": "python", "arguments": {"code": f"print({answer})"}}
            return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        return f"\\boxed{{{int(answer) + sampling.seed % 2}}}"

    return FakeEngine(respond, tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id)


async def test_eval_with_a_scripted_engine(
    tokenizer: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from agentloop.eval import eval_async

    tasks = make(ENV).tasks("test", 6)
    engine = _oracle(tokenizer, {t.data["prompt"]: t.data["answer"] for t in tasks})
    config = EvalConfig(ENV, str(tiny_model_dir), tmp_path / "run", n=4, num_tasks=6, engine="hf",
                        rollout=RolloutConfig(max_turns=3, max_response_len=128))  # fmt: skip
    s = await eval_async(config, engine=engine, progress=False)
    records = read_jsonl(tmp_path / "run" / "trajectories.jsonl")
    assert len(records) == s.episodes == 24 and s.stop_reasons == {"done": 24}
    rewards = [r["reward"] for r in records]
    assert 0 < sum(rewards) < 24
    assert s.pass_at_k[1] == pytest.approx(sum(rewards) / 24)
    assert s.tool_calls_per_episode == 1.0 and s.tool_error_rate == 0.0
    assert s.answer_rate == 1.0 and s.mean_turns == 2.0
    assert all(r["answer_correct"] == (r["reward"] == 1.0) for r in records)
    by_task: dict[str, list[str]] = {}
    for r in sorted(records, key=lambda r: (r["task_id"], r["sample_index"])):
        by_task.setdefault(r["task_id"], []).append(r["answer_key"])
    gold = {t.id: t.data["answer"] for t in tasks}
    wins = [Counter(keys).most_common(1)[0][0] == gold[t] for t, keys in by_task.items()]
    assert s.majority_at_n == pytest.approx(sum(wins) / len(wins))


def _eval_args(model: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--env", ENV, "--model", str(model), "--out", str(out), "--engine", "hf",
            "--quiet", *SMALL, *extra]  # fmt: skip


def _pairs(out: Path) -> Counter[tuple[str, int]]:
    return Counter(
        (r["task_id"], r["sample_index"]) for r in read_jsonl(out / "trajectories.jsonl")
    )


@pytest.mark.slow
def test_eval_end_to_end_on_the_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(_eval_args(tiny_model_dir, out, "--n", "2", "--num-tasks", "2")) == 0
    pairs = _pairs(out)
    assert pairs == Counter({(f"calc-test-00000{t}", i): 1 for t in range(2) for i in range(2)})
    record = read_jsonl(out / "trajectories.jsonl")[0]
    assert record["env"] == ENV and len(record["token_ids"]) == len(record["loss_mask"])
    assert {"answer", "answer_key", "answer_correct", "turns", "messages"} <= set(record)
    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert summary["config_hash"] == config["config_hash"]
    assert set(summary["pass_at_k"]) == {"1", "2"} and summary["episodes"] == 4
    assert summary["tokens_per_s"] > 0 and summary["majority_at_n"] is not None
    assert sum(summary["stop_reasons"].values()) == 4

    # An existing run is never overwritten or silently extended.
    with pytest.raises(ConfigError, match="--resume"):
        run_eval(EvalConfig(ENV, str(tiny_model_dir), out, n=2, num_tasks=2, engine="hf"))
    assert main(_eval_args(tiny_model_dir, out, "--n", "2", "--num-tasks", "2")) == 2
    # Resuming with other settings names both hashes.
    hotter = EvalConfig(ENV, str(tiny_model_dir), out, n=2, num_tasks=2, engine="hf", resume=True,
                        rollout=RolloutConfig(max_turns=2, max_response_len=32, max_prompt_len=512,
                                              temperature=0.5))  # fmt: skip
    with pytest.raises(ConfigError, match=config["config_hash"]) as err:
        run_eval(hotter, progress=False)
    assert "differs in: rollout, sampling" in str(err.value)
    # Resuming a finished run plays nothing and changes nothing.
    before = (out / "trajectories.jsonl").read_bytes()
    assert main(_eval_args(tiny_model_dir, out, "--n", "2", "--num-tasks", "2", "--resume")) == 0
    assert (out / "trajectories.jsonl").read_bytes() == before


@pytest.mark.slow
def test_resume_after_killing_a_real_eval(tiny_model_dir: Path, tmp_path: Path) -> None:
    out, tasks, n = tmp_path / "run", 8, 2
    args = _eval_args(tiny_model_dir, out, "--n", str(n), "--num-tasks", str(tasks),
                      "--concurrency", "3", "--max-response-len", "48")  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "agentloop.cli", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    path = out / "trajectories.jsonl"
    try:
        deadline = time.monotonic() + 120
        while not (path.exists() and path.read_bytes().count(b"\n") >= 3):
            assert proc.poll() is None, f"eval exited early: {proc.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "eval wrote nothing in 120 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    written = path.read_bytes()
    kept = written[: written.rfind(b"\n") + 1]
    with path.open("ab") as f:
        f.write(b'{"v":1,"task_id":"calc-test-000007","sample_ind')  # killed mid-line
    done_before = len(read_jsonl(path))
    assert 3 <= done_before < tasks * n, "the kill came too late to test resuming"

    assert main([*args, "--resume"]) == 0
    assert path.read_bytes().startswith(kept)  # finished episodes are kept, byte for byte
    pairs = _pairs(out)
    assert pairs == Counter({(f"calc-test-{t:06d}", i): 1 for t in range(tasks) for i in range(n)})
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == tasks * n


def _write_run(run: Path, means: dict[str, list[float]], chash: str = "h" * 64) -> Path:
    run.mkdir(parents=True)
    with JsonlWriter(run / "trajectories.jsonl") as w:
        for task, rewards in means.items():
            for i, r in enumerate(rewards):
                w.write(trajectory_to_dict(_traj(task, i, r)))
    parts = {"rollout": chash[:8], "chat_template": "t"}
    (run / "config.json").write_text(json.dumps({"config_hash": chash, "config_parts": parts}))
    return run


def _rewards(shift: float, tasks: int = 30) -> dict[str, list[float]]:
    base = [0.1 * (t % 7) for t in range(tasks)]
    return {f"t{t}": [min(1.0, b + shift), min(1.0, b + shift + 0.05)] for t, b in enumerate(base)}


def test_compare_verdicts(tmp_path: Path) -> None:
    a = _write_run(tmp_path / "a", _rewards(0.0))
    better = _write_run(tmp_path / "better", _rewards(0.2))
    same = _write_run(tmp_path / "same", {t: [r[1], r[0]] for t, r in _rewards(0.0).items()})
    assert compare_runs(a, better).verdict.startswith("B beats A")
    assert compare_runs(better, a).verdict.startswith("A beats B")
    c = compare_runs(a, same)
    assert c.verdict.startswith("no significant difference")
    assert c.result.mean_diff == pytest.approx(0.0) and c.same_config
    noisy = {
        t: [r[0] + (0.3 if i % 2 else -0.3)] * 2 for i, (t, r) in enumerate(_rewards(0).items())
    }
    assert compare_runs(a, _write_run(tmp_path / "noisy", noisy)).verdict.startswith("no signif")


def test_compare_by_pass_reads_the_verdict_not_the_reward(tmp_path: Path) -> None:
    """DeepEyes-style rewards (2.0 right with the tool, 0.8 right without, 0 wrong): by reward
    the second run looks worse, by pass@1 (the env's verdict) it is the same; pass_ci agrees."""
    import dataclasses

    from agentloop.eval_report import pass_ci
    from agentloop.types import Verdict

    def run(name: str, right_reward: float) -> Path:
        out = tmp_path / name
        out.mkdir()
        with JsonlWriter(out / "trajectories.jsonl") as w:
            for t in range(12):
                right = t % 3 != 0
                v = Verdict("K", "K" if right else "L", right, "rule", "")
                traj = _traj(f"t{t}", 0, right_reward if right else 0.0)
                w.write(trajectory_to_dict(dataclasses.replace(traj, verdict=v)))
        return out

    zoomed, unzoomed = run("zoomed", 2.0), run("unzoomed", 0.8)
    assert compare_runs(zoomed, unzoomed).result.mean_diff < -0.5
    by_pass = compare_runs(zoomed, unzoomed, by="pass")
    assert by_pass.result.mean_diff == 0.0 and by_pass.mean_a == pytest.approx(8 / 12)
    assert pass_ci(unzoomed).mean == pytest.approx(8 / 12)
    with pytest.raises(ConfigError, match="by='f1'"):
        compare_runs(zoomed, unzoomed, by="f1")


def test_compare_warns_when_configs_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _write_run(tmp_path / "a", _rewards(0.0))
    b = _write_run(tmp_path / "b", _rewards(0.2), chash="b" * 64)
    c = compare_runs(a, b)
    assert not c.same_config and c.differing_parts == ("rollout",)
    assert main(["eval", "--compare", str(a), str(b)]) == 0
    printed = capsys.readouterr().out
    assert "WARNING" in printed and "h" * 16 in printed and "b" * 16 in printed
    assert "B beats A" in " ".join(printed.split())
    print_comparison(compare_runs(a, a))
    assert "WARNING" not in capsys.readouterr().out


def test_compare_needs_shared_tasks(tmp_path: Path) -> None:
    a = _write_run(tmp_path / "a", {"x": [1.0], "y": [0.0]})
    b = _write_run(tmp_path / "b", {"y": [1.0], "z": [0.0]})
    with pytest.raises(ConfigError, match="share 1 task"):
        compare_runs(a, b)
    with pytest.raises(ConfigError, match="not an eval run"):
        compare_runs(a, tmp_path / "missing")
    assert main(["eval", "--env", ENV]) == 2  # --model and --out are missing


def test_engine_args_that_are_not_a_mapping_are_a_clear_error(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--engine-arg engine_args=...`` must be JSON: YAML-ish text is named, not a traceback."""
    pytest.importorskip("vllm")
    args = ["eval", "--env", ENV, "--model", str(tiny_model_dir), "--out", str(tmp_path / "r")]
    bad = "engine_args={block_size: 32}"
    assert main([*args, "--engine", "vllm", "--engine-arg", bad]) == 2
    err = capsys.readouterr().err
    assert "vllm.engine_args must be a mapping" in err and "'{block_size: 32}'" in err, err
    assert """engine_args={"block_size": 32}""" in err, err


async def test_open_engine_builds_the_openai_client(tiny_model_dir: Path) -> None:
    from agentloop.engines.openai_http import OpenAIEngine
    from agentloop.eval import open_engine

    with pytest.raises(ConfigError, match="--base-url"):
        EvalConfig(ENV, str(tiny_model_dir), Path("x"), engine="openai")
    served = {"served_model": "tiny"}
    config = EvalConfig(ENV, str(tiny_model_dir), Path("x"), engine="openai",
                        base_url="http://127.0.0.1:9/v1", engine_args=served)  # fmt: skip
    async with open_engine(config) as engine:
        assert isinstance(engine, OpenAIEngine)
        assert (engine.model, engine.base_url) == ("tiny", "http://127.0.0.1:9/v1")


async def test_a_second_eval_on_a_busy_run_dir_fails_and_nothing_is_played_twice(
    tokenizer: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two `eval --resume` on one directory: the second fails at once naming it (the first's
    flock), the first finishes with every episode once, and a later --resume works."""
    import asyncio

    from waits import eventually

    from agentloop.eval import eval_async

    tasks = make(ENV).tasks("test", 3)
    engine = _oracle(tokenizer, {t.data["prompt"]: t.data["answer"] for t in tasks})
    engine.latency_s = 0.02  # the first run is still going when the second starts
    out = tmp_path / "run"
    rollout = RolloutConfig(max_turns=3, max_response_len=128)
    config = EvalConfig(ENV, str(tiny_model_dir), out, n=2, num_tasks=3, engine="hf",
                        resume=True, concurrency=1, rollout=rollout)  # fmt: skip
    first = asyncio.create_task(eval_async(config, engine=engine, progress=False))
    path = out / "trajectories.jsonl"
    await eventually(lambda: path.exists() and path.stat().st_size > 0)
    assert not first.done()
    with pytest.raises(ConfigError, match=f"another agentloop eval is writing to {out}"):
        await eval_async(config, engine=engine, progress=False)
    assert (await first).episodes == 6
    assert _pairs(out) == Counter({(t.id, i): 1 for t in tasks for i in range(2)})
    assert (await eval_async(config, engine=engine, progress=False)).episodes == 6
    assert sum(_pairs(out).values()) == 6


def test_a_damaged_run_dir_is_a_clean_error_naming_the_file(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A corrupt config.json (on --resume) and a valid-JSON line that is not a record (on
    --compare) exit 2 with the file (and line) named, not a traceback."""
    run = _write_run(tmp_path / "a", {"t0": [1.0, 0.0]})
    (run / "config.json").write_text('{"config_hash": ')
    assert main(_eval_args(tiny_model_dir, run, "--resume")) == 2
    err = capsys.readouterr().err
    assert f"{run / 'config.json'} is not valid JSON" in err and "Traceback" not in err
    (run / "config.json").write_text('{"config_hash": "other", "config_parts": [1, 2]}')
    assert main(_eval_args(tiny_model_dir, run, "--resume")) == 2
    err = capsys.readouterr().err
    assert f"cannot resume {run}: its config hash is other" in err and "Traceback" not in err

    b = _write_run(tmp_path / "b", {"t0": [1.0, 0.0]})
    with (b / "trajectories.jsonl").open("a") as f:
        f.write('{"note": "not a record"}\n[1, 2]\n')
    assert main(["eval", "--compare", str(b), str(b)]) == 2
    err = capsys.readouterr().err
    assert f"{b / 'trajectories.jsonl'}:3 lacks ['task_id', 'sample_index']" in err


class _StuckEnv(ToolEnv):
    """One sync tool that outlives its deadline (its thread goes on until released)."""

    release = threading.Event()

    def __init__(self) -> None:
        @tool(name="stuck", timeout_s=0.2)
        def stuck() -> str:
            """Blocks until the test releases it."""
            _StuckEnv.release.wait(30)
            return "late"

        super().__init__([stuck], lambda task, messages: 0.0)

    def tasks(self, split: str = "train", limit: int | None = None) -> list[Task]:
        return [Task(f"s{i}", {"prompt": "call stuck"}) for i in range(limit or 2)]


async def test_a_tool_call_abandoned_at_its_deadline_is_counted_in_the_summary(
    tokenizer: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from agentloop.engines.fake import FakeEngine
    from agentloop.envs import register
    from agentloop.eval import eval_async
    from agentloop.tools.runtime import runtime_stats

    register("test/Stuck-v0", _StuckEnv, override=True)
    call = '<tool_call>\n{"name": "stuck", "arguments": {}}\n</tool_call>'
    engine = FakeEngine([call, "done"] * 2, tokenizer=tokenizer, eos_token_id=2)
    config = EvalConfig("test/Stuck-v0", str(tiny_model_dir), tmp_path / "run", n=1,
                        num_tasks=2, engine="hf", concurrency=1,
                        rollout=RolloutConfig(max_turns=2, max_response_len=128))  # fmt: skip
    before = runtime_stats().abandoned_total
    try:
        s = await eval_async(config, engine=engine, progress=False)
        assert s.tool_errors == {"timeout": 1.0}
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["tool_calls_abandoned"]["abandoned_total"] == before + 2
        assert summary["tool_calls_abandoned"]["abandoned_running"] >= 2  # still blocked
    finally:
        _StuckEnv.release.set()
