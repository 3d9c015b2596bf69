"""The Engine protocol: token ids in, sampled token ids + logprobs out."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

from agentloop.errors import ConfigError, InferenceError
from agentloop.types import Completion, pickled_as_tuple

if TYPE_CHECKING:
    import torch

__all__ = [
    "AdapterEngine",
    "AdapterWeights",
    "Engine",
    "NamedTensors",
    "SamplingParams",
    "TrainEngine",
    "WeightSyncStats",
    "generate",
    "named_pairs",
    "prompt_token_ids",
    "reject_images",
]


@pickled_as_tuple
@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling settings for one request. ``max_tokens`` is set per turn by the rollout loop from
    the remaining budget; ``seed`` makes a request reproducible (None: engine's own randomness).

    Logprobs returned by every engine are of the distribution actually sampled from:
    ``log_softmax(logits / temperature)`` (raw logits when ``temperature == 0``, i.e. greedy).
    ``banned_token_ids`` (a VLM's vision tokens) are never sampled: their logits are -inf, in the
    logprobs too.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    banned_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ConfigError(f"sampling.max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ConfigError(f"sampling.top_k must be -1 (off) or >= 1, got {self.top_k}")

    def with_(self, **changes: object) -> SamplingParams:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return replace(self, **changes)  # type: ignore[arg-type]


@runtime_checkable
class Engine(Protocol):
    """Anything that can continue a token sequence.

    ``generate`` must not decode and re-encode: it samples directly after ``prompt_ids`` and
    returns exactly the sampled ids. ``session_id`` names the trajectory, so an engine with several
    replicas can route all turns of one episode to the same replica (prefix-cache hits).
    Errors are raised as :class:`agentloop.errors.InferenceError`.

    ``supports_images`` says whether ``generate`` takes images: an engine serving a
    vision-language model answers True and reads ``images`` (PIL images, in the order their
    placeholder runs appear in ``prompt_ids``). A text-only engine answers False and raises
    :class:`~agentloop.errors.InferenceError` for images. Callers check it first and pass
    ``images=`` only when there are some (:func:`generate`), so an engine written before images
    existed keeps working at run time.
    """

    @property
    def supports_images(self) -> bool:
        """Whether ``generate`` takes ``images=`` (a vision-language model)."""
        ...

    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[Any] = (),
    ) -> Completion: ...


#: A weight update's tensors under their HF checkpoint names: ``(name, tensor)`` pairs, or an
#: async iterable of lists of them (a trainer's gather, a push being received).
NamedTensors: TypeAlias = (
    "Iterable[tuple[str, torch.Tensor]] | AsyncIterable[Sequence[tuple[str, torch.Tensor]]]"
)


@dataclass(frozen=True, slots=True)
class WeightSyncStats:
    """What one ``update_weights`` moved and how long each part took (seconds)."""

    num_tensors: int
    num_bytes: int
    serialize_s: float
    load_s: float
    total_s: float
    direct: bool = False  # cuda_ipc's verified fast path (plain copies) instead of load_weights
    chunks: int = 1  # loads of at most ``weight_chunk_bytes`` each


@dataclass(frozen=True)
class AdapterWeights:
    """A LoRA adapter in PEFT's format: ``tensors`` under PEFT's keys
    (``base_model.model.….lora_A.weight`` ``[rank, in]``, ``….lora_B.weight`` ``[out, rank]``)
    and ``config``, the ``adapter_config.json`` mapping (``r``, ``lora_alpha``,
    ``target_modules``, ...)."""

    tensors: Mapping[str, torch.Tensor]
    config: Mapping[str, Any]

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


@runtime_checkable
class AdapterEngine(Protocol):
    """An engine that serves the base model with one LoRA adapter, updated in place
    (:class:`~agentloop.engines.vllm.VLLMEngine` started with ``lora_rank > 0``): a LoRA
    policy's weight sync then sends the adapter alone, not the merged weights."""

    @property
    def serves_lora(self) -> bool:
        """Whether this engine was started with a LoRA slot (``lora_rank > 0``)."""
        ...

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype an adapter update should arrive in (the engine's)."""
        ...

    async def update_adapter(
        self, adapter: AdapterWeights, *, version: int | None = None, interrupt: bool = False
    ) -> WeightSyncStats:
        """Replace the adapter every later request is served with, in place (same adapter id),
        under policy ``version``; running requests as in ``update_weights``."""
        ...


async def named_pairs(named: NamedTensors) -> AsyncIterator[tuple[str, torch.Tensor]]:
    """The ``(name, tensor)`` pairs of a weight update, one at a time, from either form."""
    if isinstance(named, AsyncIterable):
        async for group in named:
            for pair in group:
                yield pair
    else:
        for pair in named:
            yield pair


class TrainEngine(Engine, Protocol):
    """An engine a training run drives (``engine.backend``: :class:`~agentloop.engines.vllm.
    VLLMEngine` or :class:`~agentloop.engines.hf.HFEngine`): started and shut down by its
    worker, put to sleep while the trainer runs, and given each new policy's weights.

    :attr:`version` is the policy version of the weights loaded now (0 at start, then what
    ``update_weights(version=...)`` set), and every completion tags each sampled token with the
    version that sampled it (``Completion.versions``). ``update_weights(interrupt=True)`` stops
    running requests at a token boundary; each resumes under the new weights with what it
    sampled so far (partial rollouts)."""

    @property
    def version(self) -> int: ...

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype a weight update should arrive in (that of the weights the engine holds)."""
        ...

    @property
    def pids(self) -> tuple[int, ...]:
        """Process ids of the engine's own processes (none when it runs in this process)."""
        ...

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    async def sleep(self, level: int = 1) -> None: ...

    async def wake_up(self, tags: Sequence[str] | None = None) -> None: ...

    async def update_weights(
        self, named_tensors: NamedTensors, *, version: int | None = None, interrupt: bool = False
    ) -> WeightSyncStats: ...


async def generate(
    engine: Engine,
    prompt_ids: Sequence[int],
    sampling: SamplingParams,
    *,
    session_id: str | None = None,
    images: Sequence[Any] = (),
) -> Completion:
    """``engine.generate``, with ``images=`` only when there are images (what the rollout loop
    and engine wrappers call, so text-only engines never see the keyword)."""
    if images:
        return await engine.generate(prompt_ids, sampling, session_id=session_id, images=images)
    return await engine.generate(prompt_ids, sampling, session_id=session_id)


def reject_images(engine: object, images: Sequence[Any]) -> None:
    """Raise :class:`InferenceError` if a text-only ``engine`` was given images."""
    if images:
        raise InferenceError(
            f"{type(engine).__name__} got {len(images)} images but does not take images "
            "(supports_images is False); use an engine serving a vision-language model"
        )


def prompt_token_ids(prompt_ids: Sequence[int]) -> list[int]:
    """``prompt_ids`` as a list of ints (what every engine sends), or an
    :class:`InferenceError` naming what was passed instead."""
    try:
        return [int(t) for t in prompt_ids]
    except (TypeError, ValueError) as e:
        raise InferenceError(
            f"prompt_ids must be a sequence of token ids (ints), got {str(prompt_ids)[:80]!r}"
        ) from e
