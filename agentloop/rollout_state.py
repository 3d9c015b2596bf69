"""The rollout loop's accumulator: one episode's token state, built into its trajectories.

An episode is one token-exact trajectory, or, under ``rollout.thinking=strip`` with a template
that rewrites history, one trajectory per turn: :meth:`EpisodeState.restart` closes the current
sample and opens the next one on the template's fresh rendering of the history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentloop.types import Completion, Message, StopReason, Trajectory, Turn, Verdict

if TYPE_CHECKING:
    from agentloop.chat import TokenBuilder
    from agentloop.envs import StepResult

__all__ = ["EpisodeState"]


@dataclass(frozen=True)
class _Closed:
    """A finished turn-sample of a split episode: its tokens, turn and messages."""

    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    prompt_len: int
    turns: tuple[Turn, ...]
    messages: tuple[Message, ...]
    images: tuple[Any, ...]
    image_grids: tuple[tuple[int, int, int], ...]


@dataclass
class EpisodeState:
    """Mutable accumulator behind an episode's trajectories; what was built survives a failure.

    ``token_ids`` etc. hold the current sample (the whole episode unless it is split);
    ``base_len`` is the first prompt's length, from which the response budget counts.
    """

    task_id: str
    sample_index: int
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_len: int = 0
    base_len: int = 0
    messages: list[Message] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    verdict: Verdict | None = None
    images: list[Any] = field(default_factory=list)
    image_grids: list[tuple[int, int, int]] = field(default_factory=list)
    versions: list[int] | None = field(default_factory=list)  # None: an engine gave none
    closed: list[_Closed] = field(default_factory=list)
    first_turn: int = 0  # index into ``turns`` of the current sample's first turn

    def add_images(self, messages: list[Message], builder: TokenBuilder) -> None:
        """Record the images of messages just appended, in token order (VLM episodes)."""
        images = [im for m in messages for im in m.images]
        if images:  # a text turn skips the builder (which names a missing vision processor)
            self.images.extend(images)
            self.image_grids.extend(builder.image_grids(messages))

    def count_tool_errors(self, result: StepResult) -> None:
        for r in result.tool_results:
            if r.error_kind is not None:
                key = f"tool_error/{r.error_kind}"
                self.metrics[key] = self.metrics.get(key, 0.0) + 1.0

    @property
    def response_len(self) -> int:
        """Tokens of the current context after the first prompt (what the budget counts)."""
        return len(self.token_ids) - self.base_len

    def append(self, ids: list[int] | tuple[int, ...], *, sampled: Completion | None) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(sampled.logprobs if sampled else [0.0] * len(ids))
        if self.versions is not None:
            if sampled is not None and not sampled.versions:
                self.versions = None  # the engine tracks no policy versions
            else:
                self.versions.extend(sampled.versions if sampled else [-1] * len(ids))

    def _snapshot(self) -> _Closed:
        """The current sample, frozen."""
        return _Closed(
            tuple(self.token_ids),
            tuple(self.loss_mask),
            tuple(self.logprobs),
            tuple(self.versions or ()),
            self.prompt_len,
            tuple(self.turns[self.first_turn :]),
            tuple(self.messages),
            tuple(self.images),
            tuple(self.image_grids),
        )

    def restart(self, prompt: list[int], messages: list[Message], builder: TokenBuilder) -> None:
        """Close the current sample (its messages end with its sampled turn) and open the next
        one on ``prompt``, the template's rendering of ``messages`` (the whole history)."""
        n = len(self.messages)
        self.closed.append(self._snapshot())
        self.messages.extend(messages[n:])
        self.token_ids, self.loss_mask, self.logprobs = [], [], []
        self.images, self.image_grids, self.first_turn = [], [], len(self.turns)
        if self.versions is not None:
            self.versions = []
        self.append(prompt, sampled=None)
        self.prompt_len = len(prompt)
        self.add_images(self.messages, builder)

    def build(self, reason: StopReason, error: str | None) -> list[Trajectory]:
        """The episode's trajectories: one, or one per turn-sample. Every sample of a split
        episode carries the episode's reward, stop reason, error and env metrics, and
        ``segments``/``segment_index`` like a proxied agent's segments (the last one stands
        for the episode in eval summaries)."""
        samples = [*self.closed, self._snapshot()]
        out = []
        for k, s in enumerate(samples):
            metrics = {
                "turns": float(len(s.turns)),
                "response_tokens": float(len(s.token_ids) - s.prompt_len),
                "trained_tokens": float(s.loss_mask.count(1)),  # the mask holds only 0 and 1
                "gen_time_s": sum(t.gen_latency_s for t in s.turns),
                "env_time_s": sum(t.env_latency_s for t in s.turns),
            }
            if s.turns:
                metrics["tool_calls"] = float(sum(t.tool_calls for t in s.turns))
                metrics["tool_errors"] = float(sum(t.tool_errors for t in s.turns))
            if len(samples) > 1:
                metrics.update(segments=float(len(samples)), segment_index=float(k))
            metrics.update(self.metrics)
            out.append(
                Trajectory(
                    task_id=self.task_id,
                    token_ids=s.token_ids,
                    loss_mask=s.loss_mask,
                    logprobs=s.logprobs,
                    prompt_len=s.prompt_len,
                    reward=self.reward,
                    stop_reason=reason,
                    turns=s.turns,
                    messages=s.messages,
                    metrics=metrics,
                    error=error,
                    sample_index=self.sample_index,
                    images=s.images,
                    image_grids=s.image_grids,
                    versions=s.versions,
                    verdict=self.verdict,
                )
            )
        return out
