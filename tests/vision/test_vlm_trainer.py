"""The policy worker on the tiny Qwen2.5-VL: loading and checkpoint names, logprobs with pixel
inputs and M-RoPE positions, packed micro-batches that keep each sequence's images, agreement with
the HF engine's logprobs, and ``actor.freeze_vision`` (fp32, CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from agentloop.chat import TokenBuilder
from agentloop.errors import ConfigError, TrajectoryError
from agentloop.trainers.packing import TrainSeq, train_seqs
from agentloop.trainers.worker import PolicyWorker, WorkerConfig
from agentloop.types import Message, StopReason, Trajectory
from agentloop.vision import VisionProcessor

SMALL = 48 * 28 * 28  # at most 48 tokens an image: short sequences, a quick test


@pytest.fixture(scope="module")
def vision(tiny_vlm_dir: Path, vlm_tokenizer: Any) -> VisionProcessor:
    return VisionProcessor.from_pretrained(tiny_vlm_dir, tokenizer=vlm_tokenizer, max_pixels=SMALL)


@pytest.fixture(scope="module")
def builder(vlm_tokenizer: Any, vision: VisionProcessor) -> TokenBuilder:
    return TokenBuilder(vlm_tokenizer, vision=vision)


def _image(w: int, h: int, seed: int) -> Any:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def _trajectory(builder: TokenBuilder, images: tuple[Any, ...], seed: int) -> Trajectory:
    """A prompt showing ``images`` plus a random 'response' (loss mask 1) of 6 to 11 tokens."""
    prompt = builder.prompt_ids([Message("user", f"What is shown? ({seed})", images=images)])
    g = torch.Generator().manual_seed(seed)
    response = torch.randint(10, 1500, (6 + seed % 6,), generator=g).tolist()
    n = len(prompt) + len(response)
    return Trajectory(
        task_id=f"t{seed}",
        token_ids=(*prompt, *response),
        loss_mask=(0,) * len(prompt) + (1,) * len(response),
        logprobs=(0.0,) * n,
        prompt_len=len(prompt),
        reward=0.0,
        stop_reason=StopReason.DONE,
        images=images,
        image_grids=tuple(builder.vision.grid(im) for im in images),  # type: ignore[union-attr]
    )


@pytest.fixture(scope="module")
def seqs(builder: TokenBuilder, vision: VisionProcessor) -> list[TrainSeq]:
    """Two images / none / one image: a packed batch mixes image and text-only sequences."""
    trajs = [
        _trajectory(builder, (_image(300, 200, 1), _image(90, 140, 2)), 1),
        _trajectory(builder, (), 2),
        _trajectory(builder, (_image(120, 120, 3),), 3),
    ]
    advantages = [torch.linspace(-1.0, 1.0, len(t.token_ids)) for t in trajs]
    return train_seqs(trajs, advantages, vision=vision)


def _worker(tiny_vlm_dir: Path, **cfg: Any) -> PolicyWorker:
    return PolicyWorker(tiny_vlm_dir, WorkerConfig(device="cpu", **cfg))


def test_the_worker_loads_a_vlm_and_exports_the_checkpoint_names(
    tiny_vlm_dir: Path, vision: VisionProcessor
) -> None:
    from safetensors import safe_open

    w = _worker(tiny_vlm_dir)
    assert w.vision is not None and w.vision.image_token_id == vision.tokens.image
    assert set(w.vision.banned_token_ids) == set(vision.tokens.banned)  # the sampler's ban
    exported = dict(w.state_dict_for_inference())
    with safe_open(str(tiny_vlm_dir / "model.safetensors"), "pt") as f:
        saved = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safetensors API)
    assert set(exported) == set(saved)  # visual.*, model.layers.*: not model.language_model.*
    assert all(torch.equal(exported[k], saved[k]) for k in saved)


def test_checkpoint_names_ask_transformers_once_per_name(
    tiny_vlm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every weight sync renames every tensor. transformers' revert walks all modules on each
    call (it was most of a sync's time), so a pure renaming is asked for once and remembered."""
    import transformers.core_model_loading as hf

    w = _worker(tiny_vlm_dir)
    first = [(name, t.data_ptr()) for name, t in w.state_dict_for_inference()]
    real, calls = hf.revert_weight_conversion, []

    def counted(model: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        calls.append(next(iter(state)))
        return real(model, state)

    monkeypatch.setattr(hf, "revert_weight_conversion", counted)
    assert [(name, t.data_ptr()) for name, t in w.state_dict_for_inference()] == first
    assert calls == []
    assert any(name.startswith("model.layers.") for name, _ in first)  # renamed from language_model


def test_logprobs_use_the_images_and_match_a_plain_forward(
    tiny_vlm_dir: Path, seqs: list[TrainSeq], vision: VisionProcessor
) -> None:
    w = _worker(tiny_vlm_dir)
    got = w.compute_logprobs(seqs)
    from transformers import AutoModelForImageTextToText

    plain = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir, dtype=torch.float32).eval()
    for s, lp in zip(seqs, got, strict=True):
        inputs: dict[str, Any] = {}
        if s.images is not None:  # the same pixels; the plain model computes its own positions
            inputs = {
                "pixel_values": s.images.pixel_values,
                "image_grid_thw": s.images.image_grid_thw,
            }
        ids = s.token_ids[None]
        with torch.no_grad():
            types = (ids == vision.tokens.image).int()
            logits = plain(input_ids=ids, mm_token_type_ids=types, **inputs).logits[0]
        logits[:, list(vision.tokens.banned)] = float("-inf")
        want = torch.log_softmax(logits[:-1], -1).gather(1, s.token_ids[1:, None])[:, 0]
        ok = torch.isfinite(want)  # a banned label (vision markup in the prompt): -inf here
        assert ok[s.loss_mask[1:] > 0].all()  # every response token is compared
        assert torch.allclose(lp[1:][ok], want[ok], atol=1e-5), (lp[1:][ok] - want[ok]).abs().max()
        assert torch.isfinite(lp).all()
        assert lp[0] == 0.0


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.to_local() if isinstance(t, DTensor) else t).detach().clone()


def _step(tiny_vlm_dir: Path, seqs: list[TrainSeq], budget: int, **cfg: Any) -> tuple[Any, ...]:
    w = _worker(tiny_vlm_dir, lr=0.0, weight_decay=0.0, max_tokens_per_micro_batch=budget, **cfg)
    lp = w.compute_logprobs(seqs)
    metrics = w.train_step(seqs)
    grads = {n: _local(p.grad) for n, p in w.model.named_parameters() if p.grad is not None}
    return lp, metrics, grads


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_a_packed_vlm_micro_batch_equals_one_sequence_at_a_time(
    tiny_vlm_dir: Path, seqs: list[TrainSeq], agg: str
) -> None:
    lp_packed, m_packed, g_packed = _step(tiny_vlm_dir, seqs, 100_000, loss_agg_mode=agg)
    lp_single, m_single, g_single = _step(tiny_vlm_dir, seqs, 1, loss_agg_mode=agg)
    assert m_packed["micro_batches"] == 1.0 and m_single["micro_batches"] == 3.0
    for a, b in zip(lp_packed, lp_single, strict=True):
        assert torch.allclose(a, b, atol=2e-6), (a - b).abs().max()
    assert m_packed["loss"] == pytest.approx(m_single["loss"], abs=1e-6)
    assert set(g_packed) == set(g_single)
    assert any(n.startswith("model.visual.") for n in g_packed)  # the vision tower has gradients
    for name, g in g_packed.items():
        assert torch.allclose(g, g_single[name], atol=1e-6, rtol=1e-4), name


def test_freeze_vision_trains_the_language_model_only(
    tiny_vlm_dir: Path, seqs: list[TrainSeq]
) -> None:
    w = _worker(tiny_vlm_dir, lr=1e-2, freeze_vision=True)
    before = {n: _local(p) for n, p in w.model.named_parameters()}
    w.train_step(seqs)
    tower = {n for n in before if n.startswith("model.visual.")}
    assert tower and all(
        torch.equal(before[n], _local(p)) for n, p in w.model.named_parameters() if n in tower
    )
    assert all(p.grad is None for n, p in w.model.named_parameters() if n in tower)
    changed = [n for n, p in w.model.named_parameters() if not torch.equal(before[n], _local(p))]
    assert changed and all(
        n.startswith("model.language_model.") or n == "lm_head.weight" for n in changed
    )
    trained = {id(p) for g in w.optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in trained for n, p in w.model.named_parameters() if n in tower)


def test_freeze_vision_on_a_text_model_is_a_config_error(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="freeze_vision"):
        PolicyWorker(tiny_model_dir, WorkerConfig(device="cpu", freeze_vision=True))


def test_a_trajectory_with_images_needs_the_processor(builder: TokenBuilder) -> None:
    t = _trajectory(builder, (_image(100, 100, 4),), 4)
    with pytest.raises(TrajectoryError, match="vision processor"):
        train_seqs([t], [0.0])


async def test_trainer_logprobs_match_the_hf_engine_on_vlm_episodes(
    tiny_vlm_dir: Path, builder: TokenBuilder, vision: VisionProcessor
) -> None:
    """ZoomVQA episodes sampled by the HF engine (temperature 0.7, vision tokens banned, the
    prompt's image through the vision tower): the worker's recomputed logprobs are the engine's."""
    from agentloop.engines.hf import HFEngine
    from agentloop.envs import make
    from agentloop.rollout import RolloutConfig, rollout

    engine = HFEngine.from_pretrained(tiny_vlm_dir)
    engine.vision = vision
    env_builder = TokenBuilder(builder.tokenizer, tools=make("agentloop/ZoomVQA-v0").tool_schemas,
                               vision=vision)  # fmt: skip
    config = RolloutConfig(max_turns=1, max_response_len=24, temperature=0.7)
    trajs = []
    for seed, task in enumerate(make("agentloop/ZoomVQA-v0").tasks("test", 2)):
        trajs.append(await rollout(make("agentloop/ZoomVQA-v0"), engine, env_builder, task,
                                   config, seed=seed))  # fmt: skip
    assert all(t.images and not t.failed and sum(t.loss_mask) for t in trajs)
    w = _worker(tiny_vlm_dir, temperature=0.7)
    got = w.compute_logprobs(train_seqs(trajs, [0.0] * len(trajs), vision=vision))
    diffs = [
        abs(float(lp[i]) - t.logprobs[i])
        for t, lp in zip(trajs, got, strict=True)
        for i, m in enumerate(t.loss_mask)
        if m
    ]
    print(f"VLM engine-vs-trainer max |Δlogprob| over {len(diffs)} tokens: {max(diffs):.3g}")
    assert max(diffs) < 1e-5, max(diffs)


def test_lora_on_a_vlm_trains_the_language_model_adapters_only(
    tiny_vlm_dir: Path, seqs: list[TrainSeq]
) -> None:
    """Adapters go on the language model's linears only (the vision tower's MLP has the same
    names and stays as it is); one step with images trains exactly the adapters."""
    from agentloop.trainers.lora_config import LoraConfig

    w = _worker(tiny_vlm_dir, lr=1e-2, lora=LoraConfig(rank=4))
    assert w.lora is not None and w.lora.layers
    assert all(n.startswith("model.language_model.") for n in w.lora.layers)
    tower_linears = [n for n, m in w.model.named_modules() if n.startswith("model.visual.")
                     and n.endswith(("gate_proj", "up_proj", "down_proj"))]  # fmt: skip
    assert tower_linears and not any(n in w.lora.layers for n in tower_linears)
    before = {n: _local(p) for n, p in w.model.named_parameters()}
    metrics = w.train_step(seqs)
    assert metrics["grad_norm"] > 0 and metrics["step_skipped"] == 0
    changed = {n for n, p in w.model.named_parameters() if not torch.equal(before[n], _local(p))}
    trainable = {n for n, p in w.model.named_parameters() if p.requires_grad}
    assert changed == trainable and all(".lora_" in n for n in trainable)
    names = [n for n, _ in w.state_dict_for_inference()]
    assert not any("lora_" in n or "base_layer" in n for n in names)
