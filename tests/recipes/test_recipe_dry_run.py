"""Dry runs of the GPU recipes on a CPU: configs, batch sizes, env/tool/model construction.

Every shipped config loads and passes its checks with the model swapped for the tiny stand-in
and the data for files that the recipe's own prepare_data.py made from public-format rows; the
batch sizes derive to what the README says; the env builds with the recipe's tool, its prompts
fit the rollout limits, an oracle episode through the rollout loop and the *real* tool earns the
top reward; the policy worker builds with the recipe's actor settings and takes one GRPO update
on that episode; the SFT configs tokenize the converted ReTool-SFT conversations.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import RECIPES
from recipe_helpers import Case, math_expression, passages, play, policies, recipe_config

from agentloop.chat import TokenBuilder
from agentloop.engines.vllm import VLLMConfig
from agentloop.trainers.config import batch_sizes, load_config
from agentloop.types import Trajectory

pytestmark = pytest.mark.slow

#: What each GPU config derives to (the recipes' READMEs quote these).
EXPECTED = {
    ("retool", "dapo_7b"): dict(sequences_per_step=1024, updates_per_step=4, num_workers=8,
                                sequences_per_worker=32, max_seq_len=18432),
    ("retool", "dapo_32b"): dict(sequences_per_step=2048, updates_per_step=4, num_workers=16,
                                 sequences_per_worker=32, max_seq_len=18432),
    ("search_r1", "grpo_3b"): dict(sequences_per_step=2560, updates_per_step=2, num_workers=8,
                                   sequences_per_worker=160, max_seq_len=5120),
    ("search_r1", "grpo_7b"): dict(sequences_per_step=2560, updates_per_step=2, num_workers=8,
                                   sequences_per_worker=160, max_seq_len=5120),
    ("deepeyes", "grpo_7b"): dict(sequences_per_step=1024, updates_per_step=1, num_workers=8,
                                  sequences_per_worker=128, max_seq_len=24576),
}  # fmt: skip


def _case(recipe: str, name: str, model: Path, data: Path) -> Case:
    from agentloop.tools.search import FakeRetriever

    if recipe == "retool":
        files = {"train": data / "dapo_math_17k.jsonl", "aime2024": data / "aime2024.jsonl",
                 "aime2025": data / "aime2025.jsonl"}  # fmt: skip
        code = lambda t: {"code": f"print({math_expression(t)})"}  # noqa: E731
        return Case(recipe, recipe_config(recipe, name, model, files), "boxed",
                    "code_interpreter", code, code, 1.0)  # fmt: skip
    if recipe == "search_r1":
        files = {"train": data / "train.jsonl", "test": data / "test.jsonl",
                 **{s: data / f"test_{s}.jsonl" for s in ("nq", "triviaqa", "popqa", "hotpotqa",
                                                          "bamboogle")}}  # fmt: skip
        query = lambda t: {"query": t.data["prompt"]}  # noqa: E731
        return Case(recipe, recipe_config(recipe, name, model, files), "tag", "search", query,
                    query, 1.0, {"retriever": FakeRetriever(passages())})  # fmt: skip
    files = {"train": data / "train.jsonl", "val": data / "val.jsonl"}
    zoom = lambda t: {"bbox_2d": [560, 400, 640, 480]}  # noqa: E731
    return Case(recipe, recipe_config(recipe, name, model, files), "tag", "image_zoom_in", zoom,
                zoom, 2.0, vision=True)  # fmt: skip


def _oracle_episodes(case: Case, builder: TokenBuilder) -> list[Trajectory]:
    tasks = list(case.env().tasks(case.config.data.val_split, 3))
    return play(case, policies(case, tasks)["oracle"], tasks, builder)


def _one_update(model: Path, case: Case, trajs: list[Trajectory]) -> dict[str, float]:
    """Build the policy worker with the recipe's actor settings (on CPU) and take one update."""
    from agentloop.trainers.packing import train_seqs
    from agentloop.trainers.worker import PolicyWorker

    actor = dataclasses.replace(case.config.actor, device="cpu", lr=1e-3)
    worker = PolicyWorker(model, actor)
    seqs = train_seqs(trajs, [0.0] * len(trajs))
    old = worker.compute_logprobs(seqs)
    adv = [s.loss_mask * (1.0 if i % 2 else -1.0) for i, s in enumerate(seqs)]
    seqs = [dataclasses.replace(s, advantages=a, old_logprobs=o, ref_logprobs=o)
            for s, a, o in zip(seqs, adv, old, strict=True)]  # fmt: skip
    return worker.train_step(seqs)


@pytest.mark.parametrize(("recipe", "name"), sorted(EXPECTED))
def test_gpu_recipe_dry_run(
    recipe: str, name: str, tiny_model_dir: Path, request: pytest.FixtureRequest
) -> None:
    data: Path = request.getfixturevalue(f"{recipe}_data")
    model = tiny_model_dir
    if recipe == "deepeyes":
        from agentloop.models.tiny_vlm import tiny_vlm_dir

        model = tiny_vlm_dir()
    case = _case(recipe, name, model, data)
    cfg = case.config
    env = case.env()
    train = env.tasks(cfg.data.train_split)
    sizes = batch_sizes(cfg, len(train))
    got = {k: getattr(sizes, k) for k in EXPECTED[(recipe, name)]}
    assert got == EXPECTED[(recipe, name)], sizes.describe()
    assert cfg.needs_ref == (cfg.actor.kl_coef > 0)
    settings = cfg.engine_settings()
    assert settings.pop("backend") == "vllm"  # the GPU recipes roll out on vLLM
    VLLMConfig(model=str(model), **settings)  # the engine settings are valid
    builder = _builder(model, env, case.vision)
    for task in env.tasks(cfg.data.val_split)[:3]:
        messages = env.prompt(task)
        assert len(builder.prompt_ids(messages)) <= cfg.rollout.max_prompt_len
    trajs = _oracle_episodes(case, builder)
    assert [t.reward for t in trajs] == [case.best_reward] * len(trajs), [t.error for t in trajs]
    assert all(t.metrics["tool_calls"] == 1 for t in trajs)
    if not case.vision:  # the trainer has no image inputs yet (see recipes/deepeyes/README.md)
        metrics = _one_update(model, case, trajs)
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), metrics
        assert metrics["grad_norm"] > 0


def _builder(model: Path, env: Any, vision: bool) -> TokenBuilder:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    processor = None
    if vision:
        from agentloop.vision import VisionProcessor

        processor = VisionProcessor.from_pretrained(model, tokenizer=tokenizer)
    return TokenBuilder(tokenizer, tools=env.tool_schemas, vision=processor)


@pytest.mark.parametrize("name", ["sft_7b", "sft_32b"])
def test_retool_sft_dry_run(name: str, tiny_model_dir: Path, retool_data: Path) -> None:
    from transformers import AutoTokenizer

    from agentloop.trainers.sft import SFTConfig
    from agentloop.trainers.sft_data import SFTTokenizer, load_conversations

    path = retool_data / "retool_sft.jsonl"
    cfg = load_config(SFTConfig, RECIPES / "retool" / f"{name}.yaml",
                      [f"model.path={tiny_model_dir}", f"data.train={path}"])  # fmt: skip
    assert cfg.trainer.batch_size == 64 and cfg.data.max_seq_len == 16384
    tok = SFTTokenizer(AutoTokenizer.from_pretrained(tiny_model_dir))
    for conv in load_conversations(cfg.data.train):
        seq = tok.train_seq(conv)
        assert len(seq) <= cfg.data.max_seq_len
        trained = seq.token_ids[seq.loss_mask > 0].tolist()
        text = tok.tokenizer.decode(trained)
        assert "\\boxed{" in text and "<tool_response>" not in text  # tool output is masked


def test_every_recipe_config_is_covered() -> None:
    shipped = {(p.parent.name, p.stem) for p in RECIPES.glob("*/*.yaml")}
    covered = set(EXPECTED) | {("retool", "sft_7b"), ("retool", "sft_32b")}
    # trained for 3 steps: tests/vision/test_vlm_rollout.py, tests/trainers/test_train_vlm.py
    covered |= {("deepeyes", "tiny")}
    # tests/recipes/test_demo.py; the GPU overlays: tests/recipes/test_demo_config.py,
    # test_demo_deepeyes_config.py and test_demo_search_r1_config.py
    families = ("tiny_retool", "tiny_deepeyes", "tiny_search_r1")
    demo = {(f, n) for f in families for n in ("demo", "sft", "grpo", "gpu")}
    assert shipped == covered | demo
