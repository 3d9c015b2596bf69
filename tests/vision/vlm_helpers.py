"""The tiny VLM taught to zoom, and the checks its episodes must pass on any engine.

The random tiny VLM would never write a tool call, so :func:`teach_the_tool_call` first teaches
it one (a few dozen Adam steps on ``<tool_call>{"name": "image_zoom_in", ...}</tool_call>``
after the prompt and after a zoom observation). :func:`save_taught` writes it as a model
directory that an engine of its own (``agentloop eval``, vLLM) loads with the same pixel budget.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from agentloop.chat import TokenBuilder
from agentloop.envs import make
from agentloop.types import Message, StopReason, ToolCall, Trajectory
from agentloop.vision import VisionProcessor, image_spans

__all__ = [
    "CALL",
    "ENV",
    "MAX_PIXELS",
    "check_token_exact",
    "recomputed_logprobs",
    "save_taught",
    "teach_the_tool_call",
]

ENV = "agentloop/ZoomVQA-v0"
BOX = [300, 200, 700, 500]  # 400x300: a crop of 48 image tokens after the processor's resize
CALL = (
    '<tool_call>\n{"name": "image_zoom_in", "arguments": {"bbox_2d": '
    + json.dumps(BOX)
    + "}}\n</tool_call>"
)
# A smaller pixel budget than the model's default (at most 48 tokens an image): the same code
# path, shorter sequences, a faster test on two CPU cores.
MAX_PIXELS = 48 * 28 * 28


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


def teach_the_tool_call(model: Any, builder: TokenBuilder, vision: VisionProcessor) -> None:
    """Train ``model`` in place to write CALL after the prompt and after a crop; eval mode after."""
    import asyncio

    import torch

    ids, images, targets = asyncio.run(_teaching_sequence(builder))
    inputs = vision.model_inputs(ids, images)
    labels = torch.tensor([ids[t] for t in targets])
    before = torch.tensor([t - 1 for t in targets])
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


def save_taught(model: Any, tiny_vlm_dir: Path, dest: Path) -> Path:
    """``model`` as a model directory: its weights, the tiny VLM's tokenizer and configs, and an
    image processor with the MAX_PIXELS budget (what eval and vLLM read)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    model.save_pretrained(dest)
    for f in tiny_vlm_dir.iterdir():
        if not (dest / f.name).exists() and f.suffix in (".json", ".jinja", ".txt"):
            shutil.copy(f, dest / f.name)
    Qwen2VLImageProcessorPil(min_pixels=4 * 28 * 28, max_pixels=MAX_PIXELS).save_pretrained(dest)
    return dest


def recomputed_logprobs(model: Any, vision: VisionProcessor, t: Trajectory) -> list[float]:
    """The HF model's logprobs of ``t``'s ids, from one forward pass on the stored ids + images
    (vision tokens banned, as when sampling; temperature 1)."""
    import torch

    with torch.no_grad():
        logits = model(**vision.model_inputs(t.token_ids, t.images)).logits[0]
    logits[:, list(vision.tokens.banned)] = float("-inf")
    ids = torch.tensor(t.token_ids)
    lp = torch.log_softmax(logits[:-1].float(), dim=-1).gather(1, ids[1:, None])[:, 0]
    return [0.0, *lp.tolist()]


def check_token_exact(t: Trajectory, calls: list[Any], vision: VisionProcessor) -> None:
    """``calls``: the engine's ``(session, prompt ids, images, completion)`` of ``t``'s episode.
    Each prompt is the trajectory's prefix, each completion the ids and logprobs after it, with
    the images of the prompt, no vision token sampled, and nothing else trained."""
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
