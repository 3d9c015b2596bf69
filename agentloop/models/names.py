"""The models built here by name (``model.path: tiny``, ``tiny-calc``, ``tiny-vlm``), resolved.

The entry points (``agentloop train``, ``sft``, ``demo``, ``eval``, ``serve-proxy``) resolve a
name to its cached directory, building it on first use; below them the trainers and engines take a
model directory. Reading a config resolves nothing: it only names the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from agentloop.errors import ConfigError

if TYPE_CHECKING:
    from agentloop.trainers.config import TrainConfig
    from agentloop.trainers.sft_config import SFTConfig

__all__ = ["MODEL_NAMES", "resolve_model", "resolve_model_path"]


def _tiny() -> Path:
    from agentloop.models.tiny import tiny_model_dir

    return tiny_model_dir()


def _cold_start(family: str) -> Callable[[], Path]:
    def build() -> Path:
        from agentloop.models.cold_start import cold_start_model_dir

        return cold_start_model_dir(family)

    return build


def _tiny_vlm() -> Path:
    from agentloop.models.tiny_vlm import tiny_vlm_dir

    return tiny_vlm_dir()


#: ``model.path`` names of the models built here on first use, and what builds each (cached).
#: ``tiny``: random weights, never solves a Calc task (exercises the pipeline, cannot learn);
#: ``tiny-calc``: the tiny model after the demo's cold-start SFT (some Calc tasks solved, so
#: GRPO's groups have rewards to learn from); ``tiny-search-r1``: the tiny model after the
#: Search-R1 demo's cold-start SFT; ``tiny-vlm``: a random tiny Qwen2.5-VL;
#: ``tiny-zoom``: the tiny VLM after the DeepEyes demo's cold-start SFT (it zooms and reads the
#: pattern of ZoomVQA-v0 grid tasks, imperfectly).
_BUILDERS: dict[str, Callable[[], Path]] = {
    "tiny": _tiny,
    "tiny-calc": _cold_start("retool"),
    "tiny-search-r1": _cold_start("search_r1"),
    "tiny-vlm": _tiny_vlm,
    "tiny-zoom": _cold_start("deepeyes"),
}
MODEL_NAMES = tuple(_BUILDERS)


def resolve_model_path(path: str) -> Path:
    """A model built here by name (:data:`MODEL_NAMES`; built on first use, then cached), else
    a local model directory."""
    if (build := _BUILDERS.get(path)) is not None:
        return build()
    if not Path(path).is_dir():
        raise ConfigError(
            f"model.path={path!r} is not a directory; pass a local HF model dir, or one of the "
            f"models built here: {', '.join(MODEL_NAMES)}"
        )
    return Path(path).resolve()


C = TypeVar("C", "TrainConfig", "SFTConfig")


def resolve_model(cfg: C) -> C:
    """``cfg`` with ``model.path`` resolved to a directory (a named model built if need be)."""
    resolved = str(resolve_model_path(cfg.model.path))
    if resolved == cfg.model.path:
        return cfg
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=resolved))
