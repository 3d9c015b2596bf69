"""The Engine protocol: token ids in, sampled token ids + logprobs out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from agentloop.errors import ConfigError
from agentloop.types import Completion

__all__ = ["Engine", "SamplingParams"]


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

    An engine that serves vision-language models sets ``supports_images = True`` and takes an
    ``images=`` keyword (PIL images, in the order their placeholder runs appear in
    ``prompt_ids``); the rollout passes it only when the episode has images.
    """

    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
    ) -> Completion: ...
