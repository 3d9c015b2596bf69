"""File checksums and model-weight fingerprints: what was written is what is read back."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["file_sha256", "model_fingerprint"]

_MODEL_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".json", ".model", ".txt")


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes, hex."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def model_fingerprint(model: str | os.PathLike[str]) -> str | None:
    """A short fingerprint of a local model directory (weights, config, tokenizer files), or
    None when ``model`` is not a directory (a hub id, a served model's name).

    Every such file is hashed whole (SHA-256 runs at GB/s: seconds for a large model, less than
    loading it), so weights replaced at the same path change it, even if one layer changed.
    Names and contents only, no timestamps: a byte-identical copy keeps the fingerprint."""
    root = Path(model)
    if not root.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if path.suffix in _MODEL_SUFFIXES:
            rel = path.relative_to(root).as_posix()
            digest.update(f"{rel}\0{file_sha256(path)}\0".encode())
    return digest.hexdigest()[:16]
