"""SFT rows with images: the DeepEyes demo's traces tokenize as a rollout does, pixels attached."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from agentloop.chat import TokenBuilder
from agentloop.errors import ConfigError
from agentloop.models.demo_deepeyes import ZoomDemoConfig, expert_rows
from agentloop.trainers.sft_data import SFTTokenizer, load_conversations
from agentloop.trainers.sft_images import load_image
from agentloop.types import Message
from agentloop.vision import image_spans


async def _rows(tmp_path: Path) -> Path:
    demo = ZoomDemoConfig(family="deepeyes", num_traces=3, num_compact=1, no_zoom_rate=0.0,
                          wrong_box_rate=0.0)  # fmt: skip
    rows = await expert_rows(demo)
    assert [r["habit"] for r in rows] == ["expert"] * 4 and all(r["reward"] == 2.0 for r in rows)
    assert "tools" in rows[0] and "tools" not in rows[3]  # the last one is a compact row
    # the first row's tool crop as a file next to the JSONL (relative path), not a data URI
    crop = rows[0]["messages"][3]["content"][0]
    load_image(crop["image"], "here").save(tmp_path / "crop.png")
    crop["image"] = "crop.png"
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


async def test_an_expert_row_tokenizes_with_its_images_as_a_rollout_does(
    tmp_path: Path, vlm_tokenizer: Any, vision: Any
) -> None:
    convs = load_conversations(await _rows(tmp_path))
    tok = SFTTokenizer(vlm_tokenizer, vision=vision)
    seq = tok.train_seq(convs[0])
    messages = tok.model_messages(convs[0])
    images = [im for m in messages for im in m.images]
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert len(images) == 2 and images[0].size == (1008, 1008)
    # the overview, then the crop: placeholder runs of each one's grid, pixels from the processor
    grids = [vision.grid(im) for im in images]
    assert seq.images is not None and seq.images.image_grid_thw.tolist() == [list(g) for g in grids]
    spans = image_spans(seq.token_ids.tolist(), vision.tokens.image)
    assert [e - s for s, e in spans] == [vision.num_tokens(g) for g in grids]
    expected = vision.pixel_inputs(images)["pixel_values"]
    assert torch.equal(seq.images.pixel_values, expected.float())
    # the prompt is the rollout's, and only the model's own tokens are trained
    builder = TokenBuilder(vlm_tokenizer, tools=convs[0].tools, vision=vision)
    prompt = builder.prompt_ids(messages[:2])
    assert seq.token_ids[: len(prompt)].tolist() == prompt
    trained = seq.token_ids[seq.loss_mask.bool()].tolist()
    assert not set(trained) & set(vision.tokens.banned)
    text = vlm_tokenizer.decode(trained)
    assert "image_zoom_in" in text and "\\boxed{" in text
    crop = np.asarray(load_image(str(tmp_path / "crop.png"), "here"))
    assert np.array_equal(np.asarray(images[1]), crop)  # the relative path was read
    compact = tok.train_seq(convs[3])
    assert len(compact) < len(seq) - 200  # no tool schema in the prompt


def test_image_parts_are_checked_and_need_a_vision_model(
    tmp_path: Path, vlm_tokenizer: Any
) -> None:
    def write(content: Any) -> Path:
        row = {"messages": [{"role": "user", "content": content},
                            {"role": "assistant", "content": "\\boxed{K}"}]}  # fmt: skip
        path = tmp_path / "rows.jsonl"
        path.write_text(json.dumps(row) + "\n")
        return path

    with pytest.raises(ConfigError, match=r"messages\[0\]\.content\[0\]: is \{'type': 'video'"):
        load_conversations(write([{"type": "video", "video": "a.mp4"}]))
    convs = load_conversations(write([{"type": "image", "image": "missing.png"}, "hi"][:1]))
    assert convs[0].messages[0].images == (str((tmp_path / "missing.png").resolve()),)
    with pytest.raises(ConfigError, match="has images but the model is a text model"):
        SFTTokenizer(vlm_tokenizer).train_seq(convs[0])
    with pytest.raises(ConfigError, match="cannot read the image"):
        SFTTokenizer._loaded(Message("user", "", images=("data:image/png;base64,AAAA",)), "x")
