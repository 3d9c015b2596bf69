"""HFEngine: token-in/token-out generation with transformers, for debugging without vLLM."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentloop.engines.base import SamplingParams
from agentloop.errors import ConfigError, InferenceError
from agentloop.types import Completion, FinishReason

if TYPE_CHECKING:
    from agentloop.vision import VisionProcessor

__all__ = ["HFEngine"]

_DTYPES = ("float32", "float16", "bfloat16")


class HFEngine:
    """Runs ``model.generate`` one request at a time in a worker thread.

    Slow but exact and dependency-free: the reference engine for tests and for models or
    platforms vLLM cannot serve. Logprobs are ``log_softmax(logits / temperature)`` of the
    sampled tokens, computed from the raw logits (``output_logits=True``). Seeds use torch's
    global generator under a lock, so a fixed seed reproduces.

    With ``vision`` (a Qwen2-VL-family model) ``generate`` also takes ``images``: the model gets
    ``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids`` built by the
    :class:`~agentloop.vision.VisionProcessor` (no torchvision needed).
    """

    def __init__(
        self,
        model: Any,
        *,
        stop_token_ids: Sequence[int] = (),
        vision: VisionProcessor | None = None,
    ) -> None:
        self.model = model.eval()
        self.stop_token_ids = tuple(stop_token_ids)
        self.vision = vision
        self._lock = threading.Lock()

    @property
    def supports_images(self) -> bool:
        return self.vision is not None

    @classmethod
    def from_settings(cls, path: str | Path, settings: Mapping[str, Any]) -> HFEngine:
        """:meth:`from_pretrained` with settings from a config or ``--engine-arg KEY=VALUE``,
        checked first: an unknown key (a vLLM setting, a typo) names the ones there are."""
        known = [p for p in inspect.signature(cls.from_pretrained).parameters if p != "path"]
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise ConfigError(
                f"unknown HFEngine setting(s) {unknown}; known: {known} (vLLM's settings apply "
                "to --engine vllm only)"
            )
        return cls.from_pretrained(path, **settings)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: str = "float32") -> HFEngine:
        """Load a causal LM, or a vision-language model with its image processor, from a local
        directory (no hub access). ``dtype``: ``float32``, ``float16`` or ``bfloat16``."""
        if dtype not in _DTYPES:
            raise ConfigError(f"HFEngine dtype={dtype!r}: must be one of {_DTYPES}")
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

        vision = None
        auto: Any = AutoModelForCausalLM
        if hasattr(AutoConfig.from_pretrained(path), "vision_config"):
            from transformers import AutoModelForImageTextToText

            from agentloop.vision import VisionProcessor

            auto, vision = AutoModelForImageTextToText, VisionProcessor.from_pretrained(path)
        model = auto.from_pretrained(path, dtype=getattr(torch, dtype))
        eos = GenerationConfig.from_pretrained(path).eos_token_id
        stop = [eos] if isinstance(eos, int) else (eos or [])
        return cls(model, stop_token_ids=stop, vision=vision)

    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[Any] = (),
    ) -> Completion:
        if images and self.vision is None:
            raise InferenceError(
                f"got {len(images)} images but this HFEngine has no vision processor; load a "
                "vision-language model with HFEngine.from_pretrained(dir)"
            )
        limit = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        if limit is not None and len(prompt_ids) + sampling.max_tokens > limit:
            raise InferenceError(
                f"prompt of {len(prompt_ids)} tokens + max_tokens {sampling.max_tokens} exceeds "
                f"the model's max_position_embeddings {limit}; lower rollout.max_response_len"
            )
        try:
            return await asyncio.to_thread(self._generate, list(prompt_ids), sampling, images)
        except InferenceError:
            raise
        except Exception as exc:
            raise InferenceError(f"HF generate failed: {type(exc).__name__}: {exc}") from exc

    def _generate(
        self, prompt_ids: list[int], sampling: SamplingParams, images: Sequence[Any]
    ) -> Completion:
        import torch

        stop = list(dict.fromkeys([*sampling.stop_token_ids, *self.stop_token_ids]))
        greedy = sampling.temperature == 0
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "do_sample": not greedy,
            "eos_token_id": stop or None,
            "pad_token_id": stop[0] if stop else 0,
            "return_dict_in_generate": True,
            "output_logits": True,
        }
        if not greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p)
            kwargs["top_k"] = sampling.top_k if sampling.top_k > 0 else None
        banned = list(sampling.banned_token_ids)
        if banned:
            kwargs["suppress_tokens"] = banned
        if self.vision is not None:
            kwargs.update(self.vision.model_inputs(prompt_ids, images))
        else:
            kwargs["input_ids"] = torch.tensor([prompt_ids])
        with self._lock, torch.no_grad():
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            out = self.model.generate(**kwargs)
        ids = out.sequences[0, len(prompt_ids) :].tolist()
        logits = torch.cat(out.logits, dim=0).float()  # [T, V]
        if banned:  # output_logits are raw: ban here too, so logprobs are of what was sampled
            logits[:, banned] = float("-inf")
        if not greedy:
            logits = logits / sampling.temperature
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
        finish: FinishReason = "stop" if ids and ids[-1] in stop else "length"
        return Completion(tuple(ids), tuple(logprobs.tolist()), finish)
