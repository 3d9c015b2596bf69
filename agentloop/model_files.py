"""What a local model directory must hold, checked before transformers reads it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agentloop.errors import ConfigError

__all__ = ["check_model_dir"]

#: Files that make a tokenizer (fast, sentencepiece, BPE/WordPiece vocabularies).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)


def check_model_dir(path: str | os.PathLike[str], flag: str, *, weights: bool = True) -> Path:
    """``path`` if it is a model directory transformers can load: a directory with a tokenizer
    and, unless ``weights`` is false (only the tokenizer is read), a ``config.json``; else a
    ``ConfigError`` naming ``flag`` (how the user gave it: ``--model``, ``model.path``), what is
    missing and the fix. Without this, a directory with no tokenizer fails deep in transformers
    with "install sentencepiece or tiktoken", which is not the problem."""
    where = Path(path)
    if not where.is_dir():
        raise ConfigError(
            f"{flag} {str(path)!r} is not a directory; pass a local Hugging Face model "
            "directory (`agentloop make-tiny-model DIR` writes a tiny one)"
        )
    missing = []
    if weights and not (where / "config.json").is_file():
        missing.append("config.json (the model's architecture)")
    if not _has_tokenizer(where):
        missing.append(f"tokenizer (none of {', '.join(TOKENIZER_FILES)} or *.tiktoken)")
    if not missing:
        return where
    dcp = (where / ".metadata").is_file() or any(where.glob("*.distcp"))
    hint = (
        " It is a DCP training checkpoint, not a model: pass the run's final/ directory."
        if dcp
        else ""
    )
    raise ConfigError(
        f"{flag} {str(path)!r} is not a model directory: it has no {' and no '.join(missing)}."
        f"{hint} Pass a directory that save_pretrained wrote (the model and its tokenizer), or "
        "copy the base model's tokenizer files into it."
    )


def _has_tokenizer(where: Path) -> bool:
    if any((where / name).is_file() for name in TOKENIZER_FILES) or any(where.glob("*.tiktoken")):
        return True
    config = where / "tokenizer_config.json"  # remote code brings its own tokenizer class
    try:
        return config.is_file() and "auto_map" in json.loads(config.read_text())
    except (OSError, ValueError):
        return False
