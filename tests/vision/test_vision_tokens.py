"""Image placeholders: expansion in the token builder, the validator, atomic truncation, records."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from PIL import Image

from agentloop.chat import TokenBuilder
from agentloop.errors import TemplateError, TrajectoryError
from agentloop.io import trajectory_from_dict, trajectory_to_dict
from agentloop.models.tiny import CHAT_TEMPLATE
from agentloop.types import Message, StopReason, Trajectory
from agentloop.vision import check_image_placeholders, image_spans, truncate_with_images


def _image(w: int, h: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def builder(vlm_tokenizer: Any, vision: Any) -> TokenBuilder:
    return TokenBuilder(vlm_tokenizer, vision=vision)


def test_grid_follows_the_processor(vision: Any) -> None:
    for size in [(1024, 768), (300, 200), (28, 28), (2000, 50), (56, 4000)]:
        image = _image(*size)
        grid = vision.grid(image)
        got = vision.pixel_inputs([image])["image_grid_thw"].tolist()
        assert [list(grid)] == got
        t, h, w = grid
        assert 4 <= vision.num_tokens(grid) <= 128 and h % 2 == w % 2 == 0 and t == 1


def test_prompt_and_observation_expand_one_run_per_image(
    builder: TokenBuilder, vision: Any
) -> None:
    big, crop = _image(1024, 768), _image(200, 120, seed=1)
    prompt = [Message("system", "s"), Message("user", "What is written?", images=(big,))]
    ids = builder.prompt_ids(prompt)
    text = builder.render(prompt, add_generation_prompt=True)
    assert text.count("<|image_pad|>") == 1 and "<|vision_start|><|image_pad|>" in text
    spans = image_spans(ids, vision.tokens.image)
    assert [e - s for s, e in spans] == [vision.num_tokens(vision.grid(big))]
    assert ids[spans[0][0] - 1] == builder.tokenizer.convert_tokens_to_ids("<|vision_start|>")
    obs = [Message("tool", "Zoomed.", name="image_zoom_in", tool_call_id="c", images=(crop,))]
    close = builder.tokenizer.convert_tokens_to_ids("<|im_end|>")
    obs_ids = builder.observation_ids(obs, [7, close])
    assert [e - s for s, e in image_spans(obs_ids, vision.tokens.image)] == [
        vision.num_tokens(vision.grid(crop))
    ]
    # the learned fragments are reused for the next observation of the same shape
    again_obs = Message("tool", "Again.", name="image_zoom_in", tool_call_id="c", images=(big,))
    again = builder.observation_ids([again_obs], [7, close])
    assert len(image_spans(again, vision.tokens.image)) == 1
    # the whole conversation renders what the ids say (pads collapsed)
    full = [*prompt, Message("assistant", "x"), *obs]
    builder.check_text([*ids, *builder.encode("x"), close, *obs_ids], full)
    assert set(builder.banned_token_ids) == {
        builder.tokenizer.convert_tokens_to_ids(t)
        for t in (
            "<|vision_start|>",
            "<|vision_end|>",
            "<|vision_pad|>",
            "<|image_pad|>",
            "<|video_pad|>",
        )
    }


def test_images_without_a_vision_processor_are_an_error(vlm_tokenizer: Any) -> None:
    text_only = TokenBuilder(vlm_tokenizer)
    assert text_only.banned_token_ids == ()
    with pytest.raises(TemplateError, match="no vision processor"):
        text_only.prompt_ids([Message("user", "hi", images=(_image(64, 64),))])


def test_a_template_that_drops_images_is_caught(vlm_tokenizer: Any, vision: Any) -> None:
    blind = TokenBuilder(vlm_tokenizer, vision=vision, chat_template=CHAT_TEMPLATE)
    with pytest.raises(TemplateError, match="0 image placeholders for 1 images"):
        blind.prompt_ids([Message("user", "hi", images=(_image(64, 64),))])


def test_validator_rejects_counts_that_disagree_with_grids() -> None:
    pad = 99
    ids = [1, 2, *[pad] * 6, 3, *[pad] * 4, 5]
    check_image_placeholders(ids, [(1, 4, 6), (1, 4, 4)], image_token_id=pad, merge_size=2)
    with pytest.raises(TrajectoryError, match="2 image placeholder runs in the token ids but 1"):
        check_image_placeholders(ids, [(1, 4, 6)], image_token_id=pad, merge_size=2)
    with pytest.raises(TrajectoryError, match="image 1: 4 placeholder tokens at \\[9, 13\\)"):
        check_image_placeholders(ids, [(1, 4, 6), (1, 4, 6)], image_token_id=pad, merge_size=2)


def test_truncation_drops_an_image_whole() -> None:
    pad, start = 99, 50
    ids = [1, start, pad, pad, pad, 51, 2, start, pad, pad, 51, 3]
    assert truncate_with_images(ids, 100, pad) == (12, 2)
    assert truncate_with_images(ids, 6, pad) == (6, 1)  # first image complete
    assert truncate_with_images(ids, 4, pad) == (1, 0)  # cut inside image 0: drop it + its start
    assert truncate_with_images(ids, 2, pad) == (1, 0)  # cut right after its start marker
    assert truncate_with_images(ids, 9, pad) == (7, 1)  # cut inside image 1
    with pytest.raises(TrajectoryError):
        truncate_with_images(ids, -1, pad)


def test_trajectory_checks_grids_and_io_round_trips_images() -> None:
    images = (_image(32, 32), _image(40, 20, seed=2))
    kwargs: dict[str, Any] = {
        "task_id": "t", "token_ids": (1, 2, 3), "loss_mask": (0, 0, 1),
        "logprobs": (0.0, 0.0, -1.0), "prompt_len": 2, "reward": 1.0,
        "stop_reason": StopReason.DONE,
    }  # fmt: skip
    with pytest.raises(TrajectoryError, match="1 image grids for 2 images"):
        Trajectory(**kwargs, images=images, image_grids=((1, 2, 2),))
    messages = (Message("user", "look", images=images[:1]), Message("assistant", "ok"),
                Message("tool", "zoom", tool_call_id="c", images=images[1:]))  # fmt: skip
    t = Trajectory(**kwargs, images=images, image_grids=((1, 2, 2), (1, 2, 4)), messages=messages)
    back = trajectory_from_dict(trajectory_to_dict(t))
    assert back.image_grids == ((1, 2, 2), (1, 2, 4))
    assert [np.asarray(im).tolist() for im in back.images] == [
        np.asarray(im).tolist() for im in images
    ]
    assert [len(m.images) for m in back.messages] == [1, 0, 1]
    assert np.array_equal(np.asarray(back.messages[2].images[0]), np.asarray(images[1]))


def test_message_content_parts() -> None:
    image = _image(8, 8)
    m = Message("user", "hi", images=(image,))
    assert m.to_template_dict()["content"] == [{"type": "image"}, {"type": "text", "text": "hi"}]
    assert Message("user", "hi").to_template_dict()["content"] == "hi"
    parsed = Message.from_dict(
        {
            "role": "user",
            "content": [{"type": "image", "image": image}, {"type": "text", "text": "hi"}],
        }
    )
    assert parsed == m


async def test_an_engine_without_images_is_a_named_engine_error(builder: TokenBuilder) -> None:
    from agentloop.engines.fake import FakeEngine
    from agentloop.envs import make
    from agentloop.rollout import RolloutConfig, rollout

    env = make("agentloop/ZoomVQA-v0")
    task = env.tasks("test", 1)[0]
    engine = FakeEngine(["\\boxed{1}"], tokenizer=builder.tokenizer, eos_token_id=2)
    t = await rollout(env, engine, builder, task, RolloutConfig())
    assert t.stop_reason == StopReason.ENGINE_ERROR and "does not take images" in (t.error or "")
    assert len(t.images) == 1 and t.image_grids == (builder.image_grids(t.messages)[0],)


@pytest.mark.slow
def test_make_tiny_model_vision_cli_is_deterministic(tmp_path: Any, tiny_vlm_dir: Any) -> None:
    from safetensors.numpy import load_file

    from agentloop.cli import main

    assert main(["make-tiny-model", "--vision", str(tmp_path / "vlm")]) == 0
    out = tmp_path / "vlm"
    for name in ("tokenizer.json", "preprocessor_config.json", "config.json"):
        assert (out / name).read_text() == (tiny_vlm_dir / name).read_text(), name
    ours, cached = (
        load_file(out / "model.safetensors"),
        load_file(tiny_vlm_dir / "model.safetensors"),
    )
    assert ours.keys() == cached.keys()
    assert all(np.array_equal(ours[k], cached[k]) for k in ours)
