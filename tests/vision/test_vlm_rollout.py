"""Multi-turn ZoomVQA episodes on the tiny VLM with the HF engine: token-exact ids, placeholder
runs that match the image grids, and logprobs that the model reproduces on the stored trajectory.

The random tiny VLM would never write a tool call, so the fixture first teaches it one (a few
dozen Adam steps on ``<tool_call>{"name": "image_zoom_in", ...}</tool_call>`` after the prompt
and after a zoom observation). Everything after that is the real pipeline: the HF engine samples
(temperature 1) with the vision tokens banned, the env crops, the builder expands placeholders.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.base import SamplingParams
from agentloop.engines.hf import HFEngine
from agentloop.envs import make
from agentloop.rollout import RolloutConfig, rollout
from agentloop.types import Completion, Message, StopReason, ToolCall, Trajectory
from agentloop.vision import VisionProcessor, check_image_placeholders, image_spans

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENV = "agentloop/ZoomVQA-v0"
BOX = [300, 200, 700, 500]  # 400x300: a crop of 48 image tokens after the processor's resize
CALL = (
    '<tool_call>\n{"name": "image_zoom_in", "arguments": {"bbox_2d": '
    + json.dumps(BOX)
    + "}}\n</tool_call>"
)


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
    """A smaller pixel budget than the model's default (at most 48 tokens an image): the same
    code path, shorter sequences, a faster test on two CPU cores."""
    return VisionProcessor.from_pretrained(
        tiny_vlm_dir, tokenizer=vlm_tokenizer, max_pixels=48 * 28 * 28
    )


@pytest.fixture(scope="module")
def builder(vlm_tokenizer: Any, vision: VisionProcessor) -> TokenBuilder:
    # The env's tools in the system turn, as eval and training show them (collect checks this).
    return TokenBuilder(vlm_tokenizer, tools=make(ENV).tool_schemas, vision=vision)


async def _teaching_sequence(builder: TokenBuilder) -> tuple[list[int], list[Any], list[int]]:
    """prompt + CALL + (real) zoom observation + CALL, with the positions of the two calls."""
    env = make(ENV)
    messages, _ = await env.reset(options={"task": env.tasks("train", 1)[0]})
    call_ids = [*builder.encode(CALL), builder.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    action = Message("assistant", CALL, (ToolCall("image_zoom_in", {"bbox_2d": BOX}, id="t"),))
    obs = (await env.step(action)).observation
    await env.close()
    prompt = builder.prompt_ids(messages)
    obs_ids = builder.observation_ids(obs, call_ids)
    ids = [*prompt, *call_ids, *obs_ids, *call_ids]
    first = list(range(len(prompt), len(prompt) + len(call_ids)))
    second = list(range(len(ids) - len(call_ids), len(ids)))
    return ids, [messages[-1].images[0], obs[0].images[0]], first + second


@pytest.fixture(scope="module")
def engine(tiny_vlm_dir: Path, builder: TokenBuilder, vision: VisionProcessor) -> HFEngine:
    import asyncio

    import torch

    engine = HFEngine.from_pretrained(tiny_vlm_dir)
    assert engine.vision is not None and engine.vision.max_pixels == 128 * 28 * 28
    engine.vision = vision  # the engine must see the images exactly as the builder counted them
    ids, images, targets = asyncio.run(_teaching_sequence(builder))
    inputs = vision.model_inputs(ids, images)
    labels = torch.tensor([ids[t] for t in targets])
    before = torch.tensor([t - 1 for t in targets])
    model = engine.model
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    model.train()
    for _ in range(150):
        logits = model(**inputs).logits[0]
        loss = torch.nn.functional.cross_entropy(logits[before], labels)
        if loss.item() < 0.005:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    assert loss.item() < 0.05, f"the tiny VLM did not learn the tool call (loss {loss.item()})"
    return engine


def recomputed_logprobs(engine: HFEngine, t: Trajectory) -> list[float]:
    """The HF model's logprobs of ``t``'s ids, from one forward pass on the stored ids + images
    (vision tokens banned, as when sampling; temperature 1)."""
    import torch

    assert engine.vision is not None
    with torch.no_grad():
        logits = engine.model(**engine.vision.model_inputs(t.token_ids, t.images)).logits[0]
    logits[:, list(engine.vision.tokens.banned)] = float("-inf")
    ids = torch.tensor(t.token_ids)
    lp = torch.log_softmax(logits[:-1].float(), dim=-1).gather(1, ids[1:, None])[:, 0]
    return [0.0, *lp.tolist()]


def _check_token_exact(t: Trajectory, calls: list[Any], vision: Any) -> None:
    assert calls, f"no engine call for {t.task_id}"
    for _, prompt, images, completion in calls:
        n, m = len(prompt), len(completion.token_ids)
        assert t.token_ids[: n + m] == prompt + completion.token_ids  # given + sampled, exactly
        assert t.loss_mask[n : n + m] == (1,) * m and t.logprobs[n : n + m] == completion.logprobs
        assert images == t.images[: len(images)]  # the engine saw the images of its prompt
        assert len(image_spans(prompt, vision.tokens.image)) == len(images)
        assert not set(completion.token_ids) & set(vision.tokens.banned)
    _, prompt, _, completion = calls[-1]
    end = len(prompt) + len(completion.token_ids)
    if end < len(t.token_ids):  # only the last turn's observation, never sampled from
        assert t.stop_reason == StopReason.MAX_TURNS and not any(t.loss_mask[end:])
    assert sum(t.loss_mask) == sum(len(c[3].token_ids) for c in calls)
    assert list(t.image_grids) == [vision.grid(im) for im in t.images]
    check_image_placeholders(
        t.token_ids, t.image_grids, image_token_id=vision.tokens.image, merge_size=2
    )


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
        _check_token_exact(t, [c for c in recorder.calls if c[0] == session], vision)
        got = recomputed_logprobs(engine, t)
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
    import shutil

    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    from agentloop.cli import main
    from agentloop.viewer import view_data

    model_dir = tmp_path / "taught-vlm"
    engine.model.save_pretrained(model_dir)
    for f in tiny_vlm_dir.iterdir():
        if not (model_dir / f.name).exists() and f.suffix in (".json", ".jinja", ".txt"):
            shutil.copy(f, model_dir / f.name)
    Qwen2VLImageProcessorPil(min_pixels=4 * 28 * 28, max_pixels=48 * 28 * 28).save_pretrained(
        model_dir
    )
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


def test_agentloop_train_refuses_a_vision_language_model_at_start_naming_it(
    tiny_vlm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trainer loads causal language models only (so far): a VLM's model.path is a clear
    start-up error naming it and what plays it, not a transformers traceback from a worker."""
    from agentloop.cli import main

    config = Path(__file__).resolve().parents[2] / "trainers/configs/grpo_calc_tiny.yaml"
    args = ["train", str(config), f"model.path={tiny_vlm_dir}", f"trainer.out_dir={tmp_path}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert str(tiny_vlm_dir) in err and "vision-language model" in err and "eval" in err


async def test_the_trainer_recomputes_the_engines_logprobs_on_multiturn_zoom_episodes(
    engine: HFEngine, builder: TokenBuilder, vision: VisionProcessor, tiny_vlm_dir: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    """The policy worker, loaded from the taught VLM's directory, scores multi-turn episodes
    (overview + crops, packed into one micro-batch) at the engine's logprobs: text level."""
    import shutil

    from agentloop.trainers.packing import train_seqs
    from agentloop.trainers.worker import PolicyWorker, WorkerConfig

    model_dir = tmp_path / "taught-vlm"
    engine.model.save_pretrained(model_dir)
    for f in tiny_vlm_dir.iterdir():
        if not (model_dir / f.name).exists() and f.suffix in (".json", ".jinja", ".txt"):
            shutil.copy(f, model_dir / f.name)
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
