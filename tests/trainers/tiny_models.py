"""Tiny Qwen2 models for the trainer tests, built from a config (no downloads, any head_dim).

One config with overrides instead of a copy per module: :func:`tiny_qwen2_config` (vocab 128, the
unit tests' model) and :func:`write_micro_model` (the tiny model's tokenizer beside a micro Qwen2,
for GRPO-loop tests that need a model directory but no vLLM).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB = 128
_BASE: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


def tiny_qwen2_config(**overrides: Any) -> Qwen2Config:
    """Two layers of width 64 (vocab 128, 256 positions) unless ``overrides`` say otherwise."""
    return Qwen2Config(**{**_BASE, **overrides})


def build_tiny_model(attn: str = "sdpa", seed: int = 0) -> Qwen2ForCausalLM:
    """The unit tests' model in fp32 with attention ``attn``, initialised from ``seed``."""
    torch.manual_seed(seed)
    return Qwen2ForCausalLM._from_config(
        tiny_qwen2_config(), attn_implementation=attn, dtype=torch.float32
    )


def write_micro_model(tiny_model_dir: Path, out: Path) -> Path:
    """The tiny model's tokenizer files beside a micro Qwen2 of its vocabulary (2048), saved to
    ``out``: a real model directory for the GRPO loop without vLLM's head_dim floor."""
    out.mkdir(parents=True, exist_ok=True)
    for f in tiny_model_dir.iterdir():
        if f.suffix in (".json", ".jinja", ".txt") and f.name != "config.json":
            shutil.copy2(f, out / f.name)
    torch.manual_seed(0)
    config = tiny_qwen2_config(
        vocab_size=2048, max_position_embeddings=1024, tie_word_embeddings=True,
        eos_token_id=2, bos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(out)
    return out
