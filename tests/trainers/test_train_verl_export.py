"""A verl user's parquet and reward file train unchanged; `agentloop export` of its step 1."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from async_helpers import overrides
from grpo_helpers import hf_logprobs, probe_prompts, saved_rows, train_main

from agentloop.trainers.metrics import read_metrics

pytest.importorskip("vllm")
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="MathTool-v0 needs bwrap")

#: verl's ``custom_reward_function`` file as a verl user has it: the signature verl calls.
VERL_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "openai/gsm8k" and extra_info["split"] == "train"
    return {"score": float(ground_truth in solution_str) + len(solution_str) % 7 / 7}
"""


def expected_reward(text: str, truth: str) -> float:
    return float(truth in text) + len(text) % 7 / 7


@dataclass(frozen=True)
class VerlRun:
    out: Path
    log: str


@pytest.fixture(scope="module")
def verl_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> VerlRun:
    """2 steps of ``agentloop train`` (in this process) on MathTool-v0 from a verl-format parquet
    (as verl's ``gsm8k.py`` preprocessing writes it) with a verl reward file; a checkpoint each
    step. One run both tests read (tests/tiers.py tags it as a whole run)."""
    tmp = tmp_path_factory.mktemp("verl")
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} + {i}? Answer with a number."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i, "question": f"What is {i} + {i}?"},
        }
        for i in range(8)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp / "train.parquet")
    (tmp / "reward.py").write_text(VERL_REWARD)
    out = tmp / "run"
    (tmp / "run.yaml").write_text("data:\n  env: agentloop/MathTool-v0\n")
    args = [
        str(tmp / "run.yaml"),
        *overrides(
            tiny_model_dir,
            out,
            "trainer.total_steps=2",
            f"data.train_files={tmp / 'train.parquet'}",
            f"data.reward={tmp / 'reward.py'}:compute_score",
            "rollout.max_turns=1",
        ),
    ]
    log = tmp / "train.log"
    assert train_main(args, log) == 0, log.read_text()[-3000:]
    return VerlRun(out, log.read_text())


@pytest.mark.timeout(1200)
def test_a_verl_parquet_and_reward_file_train_unchanged(verl_run: VerlRun) -> None:
    """Both steps trained on the parquet's chat prompts, scored by the reward file."""
    assert sorted(read_metrics(verl_run.out)) == [1, 2]
    rows = saved_rows(verl_run.out, (1, 2))
    assert rows and all(r["task"]["data_source"] == "openai/gsm8k" for r in rows)
    scored = [r for r in rows if r["error"] is None]
    assert len(scored) == len(rows), [r["error"] for r in rows if r["error"]]
    for r in rows:
        assert r["messages"][1]["content"].startswith("What is ")  # the row's own user turn
        reply = r["messages"][-1]["content"]
        assert r["reward"] == pytest.approx(expected_reward(reply, r["task"]["answer"]))
    assert len({r["reward"] for r in rows}) > 1  # the file's scores, not the env's zeros


@pytest.mark.timeout(1200)
def test_export_of_step_1_gives_the_trainers_logprobs(
    verl_run: VerlRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``agentloop export checkpoints/step_1 DIR``: transformers loads DIR, and its logprobs
    equal the trainer's own under the step-1 weights (its DCP checkpoint loaded into a
    PolicyWorker), CPU fp32, to 1e-5; they differ from the start model's and step 2's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentloop.trainers.checkpoint import load_checkpoint
    from agentloop.trainers.packing import TrainSeq
    from agentloop.trainers.worker import PolicyWorker, WorkerConfig

    step1 = verl_run.out / "checkpoints" / "step_00000001"
    out = tmp_path / "hf"
    from agentloop.cli import main

    assert main(["export", str(step1), str(out)]) == 0, capsys.readouterr().err[-3000:]
    assert AutoTokenizer.from_pretrained(out).chat_template  # the tokenizer came along
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    config = yaml_model_path(verl_run.out)
    worker = PolicyWorker(config, WorkerConfig(device="cpu", dtype="float32"))
    prompts = probe_prompts()
    completions = [p[-10:] for p in prompts]
    seqs = [
        TrainSeq(torch.tensor(p + c), torch.ones(len(p) + len(c)), torch.zeros(len(p) + len(c)),
                 torch.zeros(len(p) + len(c)))
        for p, c in zip(prompts, completions, strict=True)
    ]  # fmt: skip
    start = [lp[len(p) :] for lp, p in zip(worker.compute_logprobs(seqs), prompts, strict=True)]
    load_checkpoint(worker, step1)
    trainer = [lp[len(p) :] for lp, p in zip(worker.compute_logprobs(seqs), prompts, strict=True)]
    exported = [hf_logprobs(model, p, c) for p, c in zip(prompts, completions, strict=True)]
    for mine, theirs, before in zip(exported, trainer, start, strict=True):
        assert (mine - theirs).abs().max().item() <= 1e-5
        assert (mine - before).abs().max().item() > 1e-3  # step 1 moved the weights
    load_checkpoint(worker, verl_run.out / "checkpoints" / "step_00000002")
    later = [lp[len(p) :] for lp, p in zip(worker.compute_logprobs(seqs), prompts, strict=True)]
    assert max((m - s).abs().max().item() for m, s in zip(exported, later, strict=True)) > 1e-4


def yaml_model_path(run: Path) -> Path:
    """The model dir the run trained (its config.yaml's ``model.path``)."""
    from agentloop.trainers.config import TrainConfig, load_config

    return Path(load_config(TrainConfig, run / "config.yaml").model.path)
