"""Where agentloop keeps the models it builds: the tiny model's cache directory, built once."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_CACHE_DIR", "ENV_VAR", "cache_dir", "cached_build"]

#: Overrides where the tiny model is kept; the other built models sit beside it.
ENV_VAR = "AGENTLOOP_TINY_MODEL"
DEFAULT_CACHE_DIR = Path("~/.cache/agentloop/tiny-qwen2-v1")


def cache_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The tiny model's directory: ``override``, else ``$AGENTLOOP_TINY_MODEL``, else default."""
    return Path(override or os.environ.get(ENV_VAR) or DEFAULT_CACHE_DIR).expanduser()


def cached_build(target: Path, build: Callable[[Path], Any]) -> Path:
    """``target`` once it holds ``model.safetensors``, else ``build(tmp)`` renamed into place."""
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary directory
        try:
            os.rename(tmp, target)  # atomic; replaces only a missing or empty directory
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
