"""Random-init Qwen2 model dirs of real sizes for the GPU benchmarks (no weights to download)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

# Shapes of Qwen2.5-0.5B and Qwen2.5-1.5B (vocab, widths, depths, GQA, tied embeddings).
SIZES: dict[str, dict[str, object]] = {
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2),
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2),
}  # fmt: skip
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "vocab.json", "merges.txt")  # fmt: skip


def qwen2_config(size: str, max_len: int = 16384) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=151936, max_position_embeddings=max_len, rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=True, torch_dtype="bfloat16", **SIZES[size],
    )  # fmt: skip


def num_params(config: Qwen2Config) -> int:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def make_model_dir(size: str, dest: Path, tokenizer_dir: Path) -> Path:
    """Save a seeded random-init model of ``size`` (bf16 safetensors) with the tokenizer of
    ``tokenizer_dir`` (its ids are a subset of the model's vocab). Reused when present."""
    if (dest / "config.json").exists():
        return dest
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(qwen2_config(size), dtype=torch.bfloat16)
    model.save_pretrained(dest)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, dest / name)
    return dest
