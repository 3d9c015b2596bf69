"""skyrl-gym's envs, unchanged, through agentloop's env API and ``agentloop eval``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentloop.envs import make
from agentloop.errors import EnvError
from agentloop.types import Message

pytest.importorskip("skyrl_gym")


def skyrl_rows(n: int, env_class: str = "gsm8k_multi_turn") -> list[dict[str, Any]]:
    """Rows as SkyRL's ``examples/gsm8k/gsm8k_dataset.py`` writes them."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} + {i}? End with '#### N'."}],
            "env_class": env_class,
            "reward_spec": {"method": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(n)
    ]


def write_skyrl_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_a_skyrl_multi_turn_env_gives_its_per_turn_rewards(tmp_path: Path) -> None:
    """skyrl-gym's own GSM8kMultiTurnEnv and compute_score are the oracle: a well-formatted wrong
    answer earns 0.2/max_turns, a right one 1.0 and ends the episode; its feedback comes back as
    a user turn, its metrics with the last step."""
    from skyrl_gym.envs.gsm8k.utils import compute_score

    data = write_skyrl_parquet(tmp_path / "train.parquet", skyrl_rows(3))
    env = make("skyrl_gym:gsm8k_multi_turn", files={"train": str(data)}, max_turns=4)
    assert env.env_id == "skyrl_gym:gsm8k_multi_turn"
    task = env.tasks("train")[2]
    assert task.id == "openai/gsm8k-2" and task.data["answer"] == "4"

    async def play() -> list[Any]:
        obs, _ = await env.reset(options={"task": task})
        assert obs == [Message("user", "What is 2 + 2? End with '#### N'.")]
        steps = [await env.step(Message("assistant", text)) for text in ("#### 5", "no", "#### 4")]
        await env.close()
        return steps

    wrong, unformatted, right = asyncio.run(play())
    assert wrong.reward == pytest.approx(0.2 / 4) == compute_score("#### 5", "4", "strict", 0.05)
    assert wrong.observation[0].role == "user" and "#### ANSWER" in wrong.observation[0].content
    assert unformatted.reward == 0.0 and not unformatted.terminated
    assert right.reward == 1.0 and right.terminated and right.observation == []
    assert right.metrics == {"skyrl/steps": 3.0}


def test_bad_skyrl_ids_rows_and_arguments_are_named(tmp_path: Path) -> None:
    with pytest.raises(EnvError, match=r"no env 'gsm8k_multi'\. Did you mean 'gsm8k_multi_turn'"):
        make("skyrl_gym:gsm8k_multi")
    with pytest.raises(EnvError, match=r"no framework is named 'skyrl'\. Did you mean 'skyrl_gym'"):
        make("skyrl:gsm8k")
    with pytest.raises(EnvError, match=r"'file'.*Did you mean 'files'"):
        make("skyrl_gym:gsm8k", file={})
    data = write_skyrl_parquet(tmp_path / "t.parquet", skyrl_rows(2, env_class="gsm8k"))
    env = make("skyrl_gym:gsm8k_multi_turn", files={"test": str(data)})
    with pytest.raises(EnvError, match="env_class 'gsm8k'; play it with --env skyrl_gym:gsm8k"):
        env.tasks("test")
    with pytest.raises(EnvError, match="reads its tasks from SkyRL-format files"):
        make("skyrl_gym:gsm8k").tasks("test")


def test_skyrl_rows_feed_agentloops_own_file_backed_envs(tmp_path: Path) -> None:
    """SkyRL's format is data for any file-backed env: ``reward_spec.ground_truth`` is the
    answer."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in skyrl_rows(2)))
    env = make("agentloop/MathTool-v0", files={"train": str(data)})
    assert [t.data["answer"] for t in env.tasks("train")] == ["0", "2"]


@pytest.mark.slow  # the HF engine plays 2 episodes of up to 3 turns
def test_agentloop_eval_plays_a_skyrl_env(calc_caller_dir: Path, tmp_path: Path) -> None:
    """The tiny tool caller (it ends its turns, unlike the random tiny model) plays skyrl-gym's
    multi-turn GSM8K: every turn's reward is the env's own score of that turn's text."""
    from skyrl_gym.envs.gsm8k.utils import compute_score

    from agentloop.cli import main
    from agentloop.io import read_jsonl

    data = write_skyrl_parquet(tmp_path / "test.parquet", skyrl_rows(2))
    out = tmp_path / "run"
    args = ["eval", "--env", "skyrl_gym:gsm8k_multi_turn",
            "--env-arg", f'files={{"test": "{data}"}}', "--env-arg", "max_turns=3",
            "--model", str(calc_caller_dir), "--out", str(out), "--engine", "hf", "--quiet",
            "--n", "1", "--max-turns", "3", "--max-response-len", "200"]  # fmt: skip
    assert main(args) == 0
    records = read_jsonl(out / "trajectories.jsonl")
    assert len(records) == 2
    for r in records:
        assert r["error"] is None
        replies = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
        turns = [t["reward"] for t in r["turns"]]
        truth = str(2 * int(r["task_id"].rpartition("-")[2]))
        expected = [compute_score(text, truth, "strict", 0.2 / 3) for text in replies]
        assert turns == pytest.approx(expected) and r["reward"] == pytest.approx(sum(turns))
        # the env's feedback between the model's turns, as user turns (masked: observations)
        users = [m for m in r["messages"][1:] if m["role"] == "user"]
        assert len(users) == len(replies) - 1 and all("#### ANSWER" in m["content"] for m in users)
        assert sum(r["loss_mask"]) == sum(t["completion_tokens"] for t in r["turns"])
    assert max(len(r["turns"]) for r in records) > 1  # the env's feedback started a second turn
