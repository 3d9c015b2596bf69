"""Generate a tiny Qwen2.5-VL model, tokenizer and image processor locally, for VLM tests.

Built the same way as the tiny text model (:mod:`agentloop.models.tiny`): the same byte-level
BPE with the five Qwen-VL vision tokens added at the end of the vocabulary, a randomly initialised
``Qwen2_5_VLForConditionalGeneration`` (text tower: head_dim 64, the tiny model's shape; vision
tower: 2 blocks), and a ``Qwen2VLImageProcessor`` config with a small pixel budget so images cost
tens of tokens. Loaded with the ordinary ``from_pretrained`` calls; nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agentloop.errors import ConfigError
from agentloop.models.tiny import (
    CHAT_TEMPLATE,
    TOKEN_IDS,
    _save_tokenizer,
    cached_build,
    save_seeded_model,
    train_tokenizer,
)
from agentloop.vision import VISION_TOKENS

__all__ = [
    "DEFAULT_VLM_CACHE_DIR",
    "VISION_CHAT_TEMPLATE",
    "VLM_ENV_VAR",
    "make_tiny_vlm",
    "tiny_vlm_dir",
]

VLM_ENV_VAR = "AGENTLOOP_TINY_VLM"
DEFAULT_VLM_CACHE_DIR = Path("~/.cache/agentloop/tiny-qwen2.5-vl-v1")
_TEXT_PART = (
    "{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}"
)
_VISION_PART = (
    "{%- for part in content -%}"
    "{%- if part.type == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part.type == 'text' -%}{{- part.text -}}{%- endif -%}"
)
#: The tiny model's ChatML + tools template, with Qwen-VL's rendering of image content parts.
VISION_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(_TEXT_PART, _VISION_PART)
# The image processor's pixel budget: 4 to 128 merged 28x28 patches per image.
_MIN_PIXELS, _MAX_PIXELS = 4 * 28 * 28, 128 * 28 * 28


def _tokenizer(vocab_size: int) -> Any:
    from tokenizers import AddedToken

    tok = train_tokenizer(vocab_size - len(VISION_TOKENS))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    return tok


def _config(vocab: dict[str, int], vocab_size: int) -> Any:
    from transformers import Qwen2_5_VLConfig

    text = {
        "vocab_size": vocab_size,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "bos_token_id": None,
        "eos_token_id": TOKEN_IDS["<|im_end|>"],
        "pad_token_id": TOKEN_IDS["<|endoftext|>"],
        # mrope splits head_dim / 2 = 32 rotary pairs over (t, h, w), as [16, 24, 24] does for 128
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [8, 12, 12],
        },
    }
    vision = {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "out_hidden_size": 256,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 56,
        "fullatt_block_indexes": [1],
    }
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=vocab["<|image_pad|>"],
        video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"],
        vision_end_token_id=vocab["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def make_tiny_vlm(
    out_dir: str | os.PathLike[str],
    *,
    seed: int = 0,
    dtype: str = "float32",
    vocab_size: int = 2048,
) -> Path:
    """Build the tiny VLM + tokenizer + image processor into ``out_dir`` and return it.

    Deterministic like :func:`~agentloop.models.tiny.make_tiny_model`; the vision tokens are
    the last five ids of the vocabulary.
    """
    from transformers import Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    if dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"dtype={dtype!r} is not supported; use float32, bfloat16 or float16")
    if VISION_CHAT_TEMPLATE == CHAT_TEMPLATE:  # the text template changed under us
        raise RuntimeError("could not add image parts to CHAT_TEMPLATE; update _TEXT_PART")
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(vocab_size)
    _save_tokenizer(tok, out, chat_template=VISION_CHAT_TEMPLATE)
    config = _config(tok.get_vocab(), vocab_size)
    save_seeded_model(Qwen2_5_VLForConditionalGeneration, config, out, seed=seed, dtype=dtype)
    Qwen2VLImageProcessorPil(min_pixels=_MIN_PIXELS, max_pixels=_MAX_PIXELS).save_pretrained(out)
    return out


def tiny_vlm_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """A directory holding the tiny VLM (seed 0, float32), built once and cached.

    Location: ``cache_dir`` if given, else ``$AGENTLOOP_TINY_VLM``, else
    ``~/.cache/agentloop/tiny-qwen2.5-vl-v1``; safe under concurrent callers.
    """
    target = Path(cache_dir or os.environ.get(VLM_ENV_VAR) or DEFAULT_VLM_CACHE_DIR).expanduser()
    return cached_build(target, make_tiny_vlm)
