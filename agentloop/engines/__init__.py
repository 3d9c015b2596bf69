"""Inference engines behind one token-in/token-out protocol (each engine loads lazily)."""

from typing import TYPE_CHECKING

from agentloop._lazy import lazy_getattr

if TYPE_CHECKING:
    from agentloop.engines.base import Engine, SamplingParams
    from agentloop.engines.fake import FakeEngine
    from agentloop.engines.hf import HFEngine
    from agentloop.engines.openai_http import OpenAIEngine
    from agentloop.engines.router import ReplicatedEngine
    from agentloop.engines.vllm import VLLMConfig, VLLMEngine

__getattr__ = lazy_getattr(
    __name__,
    {
        "Engine": "agentloop.engines.base",
        "FakeEngine": "agentloop.engines.fake",
        "HFEngine": "agentloop.engines.hf",
        "OpenAIEngine": "agentloop.engines.openai_http",
        "ReplicatedEngine": "agentloop.engines.router",
        "SamplingParams": "agentloop.engines.base",
        "VLLMConfig": "agentloop.engines.vllm",
        "VLLMEngine": "agentloop.engines.vllm",
    },
)

__all__ = [
    "Engine",
    "FakeEngine",
    "HFEngine",
    "OpenAIEngine",
    "ReplicatedEngine",
    "SamplingParams",
    "VLLMConfig",
    "VLLMEngine",
]
