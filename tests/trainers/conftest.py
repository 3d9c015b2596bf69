"""Shared fixtures for the trainer tests: a tiny Qwen2 built from a config (no downloads)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB = 128


def build_tiny_model(attn: str = "sdpa", seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
    )
    return Qwen2ForCausalLM._from_config(config, attn_implementation=attn, dtype=torch.float32)


@pytest.fixture
def tiny_model() -> Callable[..., Qwen2ForCausalLM]:
    return build_tiny_model


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    # tiny tensors: intra-op threads only add contention on a shared 2-core machine
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
