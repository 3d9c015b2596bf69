"""2 steps of ``agentloop train`` with ``turn_rloo`` on a SkyRL user's own skyrl-gym env."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from async_helpers import overrides
from grpo_helpers import TrainCLI, saved_rows

from agentloop.trainers.metrics import read_metrics

pytest.importorskip("vllm")
pytest.importorskip("skyrl_gym")


#: A custom env as SkyRL's guide has one write it (``BaseTextEnv``, ``skyrl_gym.register``): a
#: reward every turn that the tiny model's replies vary (the random model never earns GSM8K's),
#: and feedback that asks for another turn until ``max_turns``.
SKYRL_ENV = """
from skyrl_gym import register
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput


def turn_score(action):
    return len(action) % 7 / 7


class CountEnv(BaseTextEnv):
    def __init__(self, env_config=None, extras={}):
        super().__init__()
        self.max_turns = int(extras.get("max_turns", 3))
        self.truth = extras["reward_spec"]["ground_truth"]

    def step(self, action):
        self.turns += 1
        done = self.turns >= self.max_turns
        feedback = [] if done else [{"role": "user", "content": "Check it once more."}]
        return BaseTextEnvStepOutput(
            observations=feedback, reward=turn_score(action), done=done, metadata={}
        )

    def get_metrics(self):
        return {"turns_played": self.turns}


register(id="count", entry_point=CountEnv)
"""


@pytest.fixture(scope="module")
def skyrl_run(calc_caller_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The run's directory: the env module on PYTHONPATH, a SkyRL-format parquet as
    ``data.train_files``, the tiny tool caller (it ends its turns, so the env's feedback starts
    more), per-turn credit (tests/tiers.py tags it as a whole run)."""
    tmp = tmp_path_factory.mktemp("skyrl")
    (tmp / "my_skyrl_envs.py").write_text(SKYRL_ENV)
    rows = [
        {
            "data_source": "counting",
            "prompt": [{"role": "user", "content": f"Count to {i}."}],
            "env_class": "count",
            "reward_spec": {"method": "rule", "ground_truth": str(i)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(8)
    ]  # SkyRL's dataset format
    data = tmp / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    out = tmp / "run"
    (tmp / "run.yaml").write_text("data:\n  env: skyrl_gym:my_skyrl_envs:count\n")
    args = [
        str(tmp / "run.yaml"),
        *overrides(
            calc_caller_dir,
            out,
            "trainer.total_steps=2",
            f"data.train_files={data}",
            "data.env_kwargs.max_turns=3",
            "algorithm.adv_estimator=turn_rloo",
            "rollout.max_turns=3",
            "rollout.max_response_len=128",
            "checkpoint.every=0",
        ),
    ]
    with TrainCLI().finished(args, tmp / "train.log", pythonpath=tmp):
        yield out


@pytest.mark.timeout(1200)
def test_a_skyrl_env_trains_with_per_turn_rewards(skyrl_run: Path) -> None:
    """Both steps trained; each saved trajectory's turns carry the env's own per-turn scores
    (they sum to the reward), turn_rloo credited them, and the env's metrics are the run's."""
    metrics = read_metrics(skyrl_run)
    assert sorted(metrics) == [1, 2]
    rows = saved_rows(skyrl_run, (1, 2))
    assert len(rows) == 16
    assert {r["stop_reason"] for r in rows} <= {"done", "max_turns", "max_tokens"}
    for r in rows:
        replies = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
        expected = [len(text) % 7 / 7 for text in replies]
        assert [t["reward"] for t in r["turns"]] == pytest.approx(expected)
        assert r["reward"] == pytest.approx(sum(expected))
        if r["stop_reason"] == "done":
            assert r["metrics"]["skyrl/turns_played"] == len(replies) == 3
    assert max(len(r["turns"]) for r in rows) > 1
    assert len({t["reward"] for r in rows for t in r["turns"]}) > 2  # varied per-turn rewards
    for step in (1, 2):
        assert 0 < metrics[step]["rollout/turn_reward/0"] < 1
        assert metrics[step]["adv/abs_mean"] > 0 and metrics[step]["actor/grad_norm"] > 0
