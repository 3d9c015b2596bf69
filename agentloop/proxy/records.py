"""The proxy's per-episode settings: limits, sampling, and the bounds of a request's text."""

from __future__ import annotations

from dataclasses import dataclass

from agentloop.chat import TokenBuilder
from agentloop.errors import ConfigError

__all__ = ["EpisodeLimits", "EpisodeSampling", "TextBounds"]


@dataclass(frozen=True)
class EpisodeLimits:
    """Ceilings of one episode: model requests (``max_turns``), the first prompt's tokens, and
    tokens after it (``max_response_len``: a segment's tokens after its prompt plus what earlier
    segments sampled); every segment's context is at most ``max_prompt_len + max_response_len``
    tokens. ``max_turn_tokens`` caps what one request may sample (None: off)."""

    max_turns: int = 8
    max_prompt_len: int = 1024
    max_response_len: int = 1024
    max_turn_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_prompt_len", "max_response_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"proxy limit {name} must be >= 1, got {getattr(self, name)}")
        if self.max_turn_tokens is not None and self.max_turn_tokens < 1:
            raise ConfigError(
                f"proxy limit max_turn_tokens must be >= 1, got {self.max_turn_tokens}"
            )

    @property
    def max_context(self) -> int:
        return self.max_prompt_len + self.max_response_len


@dataclass(frozen=True)
class TextBounds:
    """What bounds a request's size before it is tokenized: ``vocab_size`` (prompt ids must
    be below it) and ``max_token_chars``, the most characters one token spells (the longest
    vocabulary entry; :attr:`TokenBuilder.max_token_chars`). A text of more than ``n *
    max_token_chars`` characters cannot encode to ``n`` tokens or fewer (every token spells at
    most that many, and a byte-level entry's length counts bytes, at least its characters), so
    such a prompt is refused without tokenizing it. (A character count of at most ``n`` does
    not mean it fits: characters bound tokens from below only.)"""

    vocab_size: int
    max_token_chars: int

    @classmethod
    def of(cls, builder: TokenBuilder) -> TextBounds:
        return cls(len(builder.tokenizer), builder.max_token_chars)


@dataclass(frozen=True)
class EpisodeSampling:
    """How the episode samples. ``fixed`` (training, eval): these values, whatever the agent
    asks, so the trained policy is the one sampled from; otherwise the request's values win."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    fixed: bool = True
