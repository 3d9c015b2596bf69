"""2 steps of ``agentloop train`` on a verifiers environment, its rubric as the reward."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from async_helpers import overrides
from grpo_helpers import TrainCLI, saved_rows

from agentloop.trainers.metrics import read_metrics

pytest.importorskip("vllm")
pytest.importorskip("verifiers.legacy.envs.tool_env")
#: tests/envs/vf_calc.py: a vf.ToolEnv in verifiers' own format, loaded as ``vf-calc``
ENV_DIR = Path(__file__).resolve().parents[1] / "envs"


@pytest.fixture(scope="module")
def verifiers_run(
    calc_caller_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """The run's directory: the env module on PYTHONPATH (as an installed environment would
    be), ``data.env: verifiers:vf-calc`` with its ``load_environment`` arguments, the tiny tool
    caller (its calls make multi-turn rollouts; tests/tiers.py tags it as a whole run)."""
    tmp = tmp_path_factory.mktemp("verifiers")
    out = tmp / "run"
    (tmp / "run.yaml").write_text("data:\n  env: verifiers:vf-calc\n")
    args = [
        str(tmp / "run.yaml"),
        *overrides(
            calc_caller_dir,
            out,
            "trainer.total_steps=2",
            "data.env_kwargs.env_args.num_examples=8",
            "data.env_kwargs.env_args.max_turns=3",
            "rollout.max_turns=3",
            "rollout.max_response_len=128",
            "checkpoint.every=0",
        ),
    ]
    with TrainCLI().finished(args, tmp / "train.log", pythonpath=ENV_DIR):
        yield out


@pytest.mark.timeout(1200)
def test_a_verifiers_env_trains_on_its_rubric(verifiers_run: Path) -> None:
    """Both steps trained; each saved trajectory's reward is the rubric's weighted sum of its
    functions' scores (the trajectory's ``verifiers/*`` metrics), given when one of the env's stop
    conditions ended the rollout (a reply cut at the token budget included, as verifiers scores
    it), and the rewards varied enough to train on."""
    metrics = read_metrics(verifiers_run)
    assert sorted(metrics) == [1, 2]
    rows = saved_rows(verifiers_run, (1, 2))
    assert len(rows) == 16
    scored = 0
    for r in rows:
        assert r["error"] is None, r["error"]
        m = r["metrics"]
        if "verifiers/correct_answer" not in m:  # agentloop's limits cut it first: not scored
            assert r["stop_reason"] != "done" and r["reward"] == 0.0
            continue
        scored += 1
        replies = [x for x in r["messages"] if x["role"] == "assistant"]
        assert m["verifiers/num_turns"] == len(replies) <= 3
        expected = m["verifiers/correct_answer"] + 0.5 * m["verifiers/reply_length"]
        assert r["reward"] == pytest.approx(expected)
    assert scored >= 8, [(r["stop_reason"], len(r["turns"])) for r in rows]
    assert max(len(r["turns"]) for r in rows) > 1  # the env's tool answered, a second turn
    assert len({r["reward"] for r in rows}) > 2
    for step in (1, 2):
        assert metrics[step]["adv/abs_mean"] > 0 and metrics[step]["actor/grad_norm"] > 0
