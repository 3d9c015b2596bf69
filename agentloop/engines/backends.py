"""The engine a training run's workers start, by ``engine.backend``: vLLM, or transformers."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Literal

from agentloop.engines.base import TrainEngine

__all__ = ["BACKENDS", "EngineBackend", "start_train_engine"]

EngineBackend = Literal["vllm", "hf"]
BACKENDS: tuple[EngineBackend, ...] = ("vllm", "hf")


async def start_train_engine(model_dir: str, settings: Mapping[str, Any]) -> TrainEngine:
    """Start the engine that ``settings`` (a run's ``engine`` section as
    :meth:`~agentloop.trainers.config.TrainConfig.engine_settings` gives it) asks for.

    ``backend: vllm`` (the default): a :class:`~agentloop.engines.vllm.VLLMEngine` with the
    other settings. ``backend: hf``: an :class:`~agentloop.engines.hf.HFEngine` (one request
    at a time; for models or platforms vLLM cannot serve, such as a vision-language model on
    a CPU), which takes ``dtype`` and ``weight_sync_timeout_s`` only."""
    rest = dict(settings)
    backend = rest.pop("backend", "vllm")
    if backend == "hf":
        from agentloop.engines.hf import HFEngine

        return await asyncio.to_thread(
            HFEngine.from_pretrained,
            model_dir,
            dtype=rest["dtype"],
            weight_sync_timeout_s=rest["weight_sync_timeout_s"],
        )
    from agentloop.engines.vllm import VLLMEngine

    engine = VLLMEngine.create(model_dir, **rest)
    try:
        await engine.start()
    except BaseException:
        await engine.shutdown()
        raise
    return engine
