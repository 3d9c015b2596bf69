"""Bring your own data and reward: verl's dataset rows in every file-backed env, reward files."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentloop.env_maker import env_factory
from agentloop.envs import make
from agentloop.envs.custom_reward import load_reward
from agentloop.envs.math_tool import MATH_SCHEMA
from agentloop.envs.rewards import Reward
from agentloop.envs.task_files import load_tasks, prompt_messages
from agentloop.errors import ConfigError, EnvError
from agentloop.trainers.config import TrainConfig, load_config
from agentloop.types import Message, Task


def verl_row(i: int, answer: str = "42", **extra: Any) -> dict[str, Any]:
    """A row as verl's examples/data_preprocess/gsm8k.py writes it."""
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"What is {i} + 1? Let's think step by step."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": i, "answer": "...", "question": f"q{i}"},
        **extra,
    }


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_verl_parquet_rows_load_as_tasks_with_chat_prompts(tmp_path: Path) -> None:
    rows = [verl_row(0), verl_row(1, "7")]
    rows[1]["prompt"] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 6 + 1?"},
    ]
    tasks = load_tasks(write_parquet(tmp_path / "train.parquet", rows), MATH_SCHEMA)
    assert [t.id for t in tasks] == ["openai/gsm8k-0", "openai/gsm8k-1"]
    assert tasks[1].data["answer"] == "7"
    assert tasks[1].data["data_source"] == "openai/gsm8k"
    assert tasks[1].data["extra_info"]["question"] == "q1"
    # the env's system prompt goes first unless the row brings its own
    assert [m.role for m in prompt_messages(tasks[0], "SYS")] == ["system", "user"]
    assert prompt_messages(tasks[1], "SYS") == [
        Message("system", "Be brief."),
        Message("user", "What is 6 + 1?"),
    ]


def test_a_file_backed_env_plays_a_verl_jsonl_file(tmp_path: Path) -> None:
    import json

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(verl_row(i)) + "\n" for i in range(3)))
    env = make("agentloop/MathTool-v0", files={"train": str(path)})
    task = env.tasks("train")[2]
    obs, _ = asyncio.run(env.reset(options={"task": task}))
    assert obs[-1] == Message("user", "What is 2 + 1? Let's think step by step.")
    assert obs[0].role == "system"


def test_bad_verl_rows_are_named_by_file_and_row(tmp_path: Path) -> None:
    bad_role = verl_row(1)
    bad_role["prompt"] = [{"role": "bot", "content": "hi"}]
    no_truth = verl_row(2)
    no_truth["reward_model"] = {"style": "rule"}
    path = write_parquet(tmp_path / "bad.parquet", [verl_row(0), bad_role, no_truth])
    with pytest.raises(EnvError) as info:
        load_tasks(path, MATH_SCHEMA)
    text = str(info.value)
    assert f"{path}[row 1]: 'prompt' message 0 is" in text and "system/user/assistant" in text
    assert f"{path}[row 2]: 'answer' is missing; give a string" in text
    assert "2 bad math task row(s) (of 3)" in text


VERL_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    seen.append((data_source, solution_str, ground_truth, extra_info["index"]))
    return {"score": float(ground_truth in solution_str), "chars": float(len(solution_str))}

seen = []
"""


def _task() -> Task:
    from agentloop.envs.task_files import from_verl

    row = from_verl(verl_row(3, "4"), 0)
    return Task(id=row.pop("id"), data=row)


def test_a_verl_reward_file_is_called_as_verl_calls_it(tmp_path: Path) -> None:
    (tmp_path / "my_reward.py").write_text(VERL_REWARD)
    fn = load_reward(f"{tmp_path}/my_reward.py:compute_score")
    messages = [Message("user", "q"), Message("assistant", "it is 4")]
    assert fn(_task(), messages) == Reward(1.0, {"chars": 7.0})
    module = next(m for k, m in sys.modules.items() if k.startswith("agentloop_reward_"))
    assert module.seen == [("openai/gsm8k", "it is 4", "4", 3)]


def test_an_agentloop_reward_by_module_path_async_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mod_reward.py").write_text(
        "async def score(task, messages):\n    return len(messages) / 10\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_reward("mod_reward:score")
    assert asyncio.run(fn(_task(), [Message("assistant", "x")])) == pytest.approx(0.1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("no_colon.py", "must be 'path/to/file.py:function'"),
        ("{tmp}/missing.py:fn", "is not a file"),
        (
            "{tmp}/my_reward.py:compute_scor",
            "has no function 'compute_scor'; it has ['compute_score']",
        ),
        ("not_a_module_here:fn", "cannot import module 'not_a_module_here'"),
    ],
)
def test_a_bad_reward_spec_is_a_config_error_naming_it(
    tmp_path: Path, spec: str, named: str
) -> None:
    (tmp_path / "my_reward.py").write_text(VERL_REWARD)
    spec = spec.format(tmp=tmp_path)
    with pytest.raises(ConfigError, match="reward") as info:
        load_reward(spec)
    assert spec in str(info.value) and named in str(info.value)


def test_the_reward_switch_replaces_a_tool_envs_reward(tmp_path: Path) -> None:
    (tmp_path / "my_reward.py").write_text(VERL_REWARD)
    path = write_parquet(tmp_path / "train.parquet", [verl_row(0, "4")])
    maker = env_factory(
        "agentloop/MathTool-v0",
        {"files": {"train": str(path)}},
        reward=f"{tmp_path}/my_reward.py:compute_score",
    )
    env = maker()

    async def play() -> float:
        await env.reset(options={"task": env.tasks("train")[0]})
        result = await env.step(Message("assistant", "4, not \\boxed{5}"))
        await env.close()
        return result.reward

    assert asyncio.run(play()) == 1.0  # the env's own reward says 0 (boxed 5)
    with pytest.raises(ConfigError, match="replaces a ToolEnv's reward"):
        env_factory(
            "agentloop/Agent-v0",
            {"agent": "json:dumps", "tasks_from": "agentloop/Calc-v0"},
            reward=f"{tmp_path}/my_reward.py:compute_score",
        )()


def test_data_train_files_and_reward_through_overrides(tmp_path: Path) -> None:
    cfg = load_config(
        TrainConfig,
        None,
        [
            "data.env=agentloop/MathTool-v0",
            "data.train_files=/d/train.parquet",
            "data.val_files=/d/test.parquet",
            "data.reward=my_reward.py:compute_score",
        ],
    )
    assert cfg.data.env_args()["files"] == {"train": "/d/train.parquet", "test": "/d/test.parquet"}
    assert cfg.data.reward == "my_reward.py:compute_score"
    with pytest.raises(ConfigError, match=r"data.reward='my_reward.py': give 'path/to/file.py"):
        load_config(TrainConfig, None, ["data.reward=my_reward.py"])


def test_export_names_what_is_not_a_checkpoint(tmp_path: Path) -> None:
    from agentloop.cli import main

    steps = tmp_path / "run" / "checkpoints"
    (steps / "step_00000001").mkdir(parents=True)
    (steps / "step_00000001" / "trainer_state.pt").write_bytes(b"")
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out")]) == 2
    with pytest.raises(ConfigError, match=r"is not a complete checkpoint.*step_00000001"):
        from agentloop.trainers.export import export_checkpoint

        export_checkpoint(tmp_path / "run", tmp_path / "out")
    with pytest.raises(ConfigError, match=r"config\.yaml"):
        export_checkpoint(steps / "step_00000001", tmp_path / "out")


EVAL_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": len(solution_str) % 7 / 7, "has_truth": float(ground_truth in solution_str)}
"""


@pytest.mark.slow  # the HF engine on the tiny model plays 2 episodes
def test_agentloop_eval_plays_a_verl_parquet_with_a_verl_reward(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from agentloop.cli import main
    from agentloop.io import read_jsonl

    data = write_parquet(tmp_path / "test.parquet", [verl_row(i, str(i + 1)) for i in range(2)])
    (tmp_path / "my_reward.py").write_text(EVAL_REWARD)
    out = tmp_path / "run"
    args = ["eval", "--env", "agentloop/MathTool-v0", "--env-arg", f'files={{"test": "{data}"}}',
            "--model", str(tiny_model_dir), "--out", str(out), "--engine", "hf", "--quiet",
            "--n", "1", "--max-turns", "1", "--max-response-len", "16",
            "--reward", f"{tmp_path}/my_reward.py:compute_score"]  # fmt: skip
    assert main(args) == 0
    records = read_jsonl(out / "trajectories.jsonl")
    assert len(records) == 2
    for r in records:
        reply = r["messages"][-1]["content"]
        assert r["reward"] == pytest.approx(len(reply) % 7 / 7)
        assert "has_truth" in r["metrics"]
    bad = [*args[:-1], f"{tmp_path}/my_reward.py:score"]
    bad[bad.index("--out") + 1] = str(tmp_path / "bad")
    assert main(bad) == 2
