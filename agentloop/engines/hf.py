"""HFEngine: token-in/token-out generation with transformers, for debugging without vLLM."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentloop.engines.base import NamedTensors, SamplingParams, WeightSyncStats, named_pairs
from agentloop.engines.gate import WeightGate, resumable
from agentloop.errors import ConfigError, InferenceError
from agentloop.types import Completion, FinishReason

if TYPE_CHECKING:
    import torch

    from agentloop.vision import VisionProcessor

__all__ = ["HFEngine"]

log = logging.getLogger(__name__)

_DTYPES = ("auto", "float32", "float16", "bfloat16")


class HFEngine:
    """Runs ``model.generate`` one request at a time in a worker thread.

    Slow but exact and dependency-free: the reference engine for tests and for models or
    platforms vLLM cannot serve. Logprobs are ``log_softmax(logits / temperature)`` of the
    sampled tokens, computed from the raw logits (``output_logits=True``). Seeds use torch's
    global generator under a lock, so a fixed seed reproduces.

    With ``vision`` (a Qwen2-VL-family model) ``generate`` also takes ``images``: the model gets
    ``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids`` built by the
    :class:`~agentloop.vision.VisionProcessor` (no torchvision needed).

    It is also a :class:`~agentloop.engines.base.TrainEngine` (``engine.backend: hf``: a
    training run on a model or platform vLLM cannot serve, such as a VLM on a CPU): weight
    updates load in place under policy versions, ``interrupt=True`` stops the running request
    at the next token and resumes it on the new weights, and sleep is a no-op.
    """

    def __init__(
        self,
        model: Any,
        *,
        stop_token_ids: Sequence[int] = (),
        vision: VisionProcessor | None = None,
        weight_sync_timeout_s: float = 600.0,
    ) -> None:
        self.model = model.eval()
        self.stop_token_ids = tuple(stop_token_ids)
        self.vision = vision
        self._lock = threading.Lock()
        self._gate = WeightGate(weight_sync_timeout_s)
        self._interrupt = threading.Event()  # set by an interrupting update: generation stops
        self._params: dict[str, torch.Tensor] | None = None  # by checkpoint name, built lazily

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
    def from_pretrained(
        cls, path: str | Path, *, dtype: str = "float32", weight_sync_timeout_s: float = 600.0
    ) -> HFEngine:
        """Load a causal LM, or a vision-language model with its image processor, from a local
        directory (no hub access). ``dtype``: ``float32``, ``float16``, ``bfloat16`` or
        ``auto`` (the checkpoint's)."""
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
        torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        model = auto.from_pretrained(path, dtype=torch_dtype)
        eos = GenerationConfig.from_pretrained(path).eos_token_id
        stop = [eos] if isinstance(eos, int) else (eos or [])
        return cls(
            model, stop_token_ids=stop, vision=vision, weight_sync_timeout_s=weight_sync_timeout_s
        )

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
        prompt = list(prompt_ids)

        async def run(sampled: list[int], rest: SamplingParams) -> Completion:
            return await asyncio.to_thread(self._generate, [*prompt, *sampled], rest, images)

        try:
            return await resumable(self._gate, sampling, run)
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
            if self._interrupt.is_set():  # admitted before an interrupting update: resume after it
                return Completion((), (), "abort")
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            out = self.model.generate(**kwargs, stopping_criteria=[_Interrupted(self._interrupt)])
        ids = out.sequences[0, len(prompt_ids) :].tolist()
        logits = torch.cat(out.logits, dim=0).float()  # [T, V]
        if banned:  # output_logits are raw: ban here too, so logprobs are of what was sampled
            logits[:, banned] = float("-inf")
        if not greedy:
            logits = logits / sampling.temperature
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
        finish: FinishReason = "stop" if ids and ids[-1] in stop else "length"
        if finish == "length" and len(ids) < sampling.max_tokens and self._interrupt.is_set():
            finish = "abort"  # stopped by an interrupting weight update
        return Completion(tuple(ids), tuple(logprobs.tolist()), finish)

    # ------------------------------------------------------------------ training (TrainEngine)
    @property
    def version(self) -> int:
        """The policy version of the weights loaded now (see ``update_weights``)."""
        return self._gate.version

    @property
    def weight_dtype(self) -> torch.dtype:
        dtype: torch.dtype = next(self.model.parameters()).dtype
        return dtype

    @property
    def pids(self) -> tuple[int, ...]:
        """None: the model runs in this process."""
        return ()

    async def start(self) -> None:
        """Nothing to start: the model was loaded with the engine."""

    async def shutdown(self) -> None:
        """Nothing to stop: the model lives in this process."""

    async def sleep(self, level: int = 1) -> None:
        log.info("HFEngine keeps its weights in memory; sleep(%d) does nothing", level)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        log.info("HFEngine never sleeps; wake_up() does nothing")

    async def update_weights(
        self, named_tensors: NamedTensors, *, version: int | None = None, interrupt: bool = False
    ) -> WeightSyncStats:
        """Copy new weights (HF checkpoint names; a subset is fine) into the model in place, as
        policy ``version``. New requests wait; running ones are waited for, or with
        ``interrupt`` stopped at the next token and resumed on the new weights."""

        async def stop_running() -> None:
            self._interrupt.set()

        t0 = time.perf_counter()
        num_tensors = num_bytes = 0
        async with self._gate.update(stop_running if interrupt else None):
            try:
                async for name, tensor in named_pairs(named_tensors):
                    await asyncio.to_thread(self._load, name, tensor)
                    num_tensors += 1
                    num_bytes += tensor.numel() * tensor.element_size()
            finally:
                self._interrupt.clear()
            if not num_tensors:
                raise ConfigError("update_weights got no tensors")
            if version is not None:
                self._gate.version = version
        total = time.perf_counter() - t0
        return WeightSyncStats(num_tensors, num_bytes, serialize_s=0.0, load_s=total, total_s=total)

    def _load(self, name: str, tensor: torch.Tensor) -> None:
        import torch

        params = self._params = self._params or _by_checkpoint_name(self.model)
        if name not in params:
            raise InferenceError(
                f"weight update names {name!r}, which is not a checkpoint tensor of this "
                f"{type(self.model).__name__} (e.g. {next(iter(params))!r})"
            )
        target = params[name]
        if tuple(tensor.shape) != tuple(target.shape):
            raise InferenceError(
                f"weight update of {name!r} has shape {tuple(tensor.shape)}, the model's is "
                f"{tuple(target.shape)}"
            )
        with self._lock, torch.no_grad():
            target.copy_(tensor)


class _Interrupted:
    """A ``generate`` stopping criterion: True once an interrupting weight update started."""

    def __init__(self, flag: threading.Event) -> None:
        self.flag = flag

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        return torch.full((input_ids.shape[0],), self.flag.is_set(), dtype=torch.bool)


def _by_checkpoint_name(model: Any) -> dict[str, torch.Tensor]:
    """The model's parameters and buffers under their HF checkpoint names (transformers renames
    some architectures' weights at load time, e.g. Qwen2.5-VL's ``model.language_model``)."""
    from transformers.core_model_loading import revert_weight_conversion

    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        names = list(revert_weight_conversion(model, {name: tensor}))
        if len(names) != 1:
            raise ConfigError(
                f"{type(model).__name__} stores {name!r} as {len(names)} checkpoint tensors; "
                "HFEngine loads renamed weights only (use engine.backend=vllm)"
            )
        out[names[0]] = tensor
    return out
