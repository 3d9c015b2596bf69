"""The Engine protocol: token ids in, sampled token ids + logprobs out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from agentloop.errors import ConfigError, InferenceError
from agentloop.types import Completion

__all__ = ["Engine", "SamplingParams", "generate", "prompt_token_ids", "reject_images"]


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
