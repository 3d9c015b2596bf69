"""Frozen records that cross every boundary: messages, tool calls, completions, trajectories."""

from __future__ import annotations

import dataclasses
import enum
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from agentloop.errors import TrajectoryError

__all__ = [
    "SERVICE_TOOL_ERRORS",
    "Completion",
    "FinishReason",
    "Message",
    "Role",
    "StopReason",
    "Task",
    "ToolCall",
    "Trajectory",
    "TrajectoryGroup",
    "Turn",
    "Verdict",
]

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "abort"]
_ROLES = ("system", "user", "assistant", "tool")


R = TypeVar("R")


def pickled_as_tuple(cls: type[R]) -> type[R]:
    """Pickle a slots dataclass as the tuple of its field values. Python's own state functions
    for slots dataclasses call ``dataclasses.fields`` for every object (~5 µs each), and a
    trajectory that a loop worker hands back holds dozens of these records."""
    names = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    assert len(names) >= 2, "attrgetter of one name returns the value, not a tuple"
    values = operator.attrgetter(*names)

    def __getstate__(self: R) -> tuple[Any, ...]:
        return values(self)

    def __setstate__(self: R, state: tuple[Any, ...]) -> None:
        for name, value in zip(names, state, strict=True):
            object.__setattr__(self, name, value)

    setattr(cls, "__getstate__", __getstate__)  # noqa: B010  # mypy: no method assignment
    setattr(cls, "__setstate__", __setstate__)  # noqa: B010
    return cls


def _freeze(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A private copy, so the caller's dict can change without changing the record.
    (A plain dict, not a mappingproxy: records must pickle to cross Ray and processes.)"""
    return dict(mapping) if mapping else {}


@pickled_as_tuple
@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call parsed from assistant text.

    A call that could not be parsed keeps its raw text and a ``parse_error``; the dispatcher turns
    it into an error observation for the model instead of dropping it.
    """

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    id: str = ""
    raw: str = ""
    parse_error: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "arguments", _freeze(self.arguments))

    def to_dict(self) -> dict[str, Any]:
        """OpenAI-style ``{"id", "type", "function": {"name", "arguments"}}`` for chat templates."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": dict(self.arguments)},
        }


@pickled_as_tuple
@dataclass(frozen=True, slots=True)
class Message:
    """One chat message. Assistant messages keep the model's raw text in ``content`` (tool-call
    markup included) and the parsed calls in ``tool_calls``; tool messages name their call.

    ``images`` (PIL images) are content parts shown *before* the text, in order: the template sees
    ``content=[{"type": "image"}, ..., {"type": "text", "text": content}]`` (Qwen-VL's layout).
    """

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    images: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise TrajectoryError(
                f"message role {self.role!r} is not one of {_ROLES}; use 'tool' for tool results"
            )
        if not isinstance(self.content, str):
            raise TrajectoryError(
                f"message content must be str, got {type(self.content).__name__}: "
                f"{self.content!r:.80}"
            )
        if type(self.tool_calls) is not tuple:  # most messages come with tuples: no re-set
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        if type(self.images) is not tuple:
            object.__setattr__(self, "images", tuple(self.images))

    def to_template_dict(self) -> dict[str, Any]:
        """The dict a chat template renders. Assistant tool calls are already in ``content`` as
        the model wrote them, so they are not passed again (a template would render them twice).
        A message with images gets list content: one image part per image, then the text."""
        content: Any = self.content
        if self.images:
            content = [{"type": "image"} for _ in self.images]
            content.append({"type": "text", "text": self.content})
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.role == "tool":
            if self.name is not None:
                out["name"] = self.name
            if self.tool_call_id is not None:
                out["tool_call_id"] = self.tool_call_id
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict that keeps the parsed tool calls (for logs and eval output)."""
        out = self.to_template_dict()
        if self.tool_calls:
            out["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        """Build from an OpenAI-style dict (``tool_calls[].function.arguments`` may be a dict).
        List content is read as parts: text parts are joined, ``{"type": "image", "image": img}``
        parts become ``images``."""
        calls = tuple(
            ToolCall(
                name=c["function"]["name"],
                arguments=c["function"].get("arguments") or {},
                id=c.get("id", ""),
            )
            for c in data.get("tool_calls") or ()
        )
        content, images = data.get("content") or "", ()
        if isinstance(content, list):
            images = tuple(p["image"] for p in content if p.get("type") == "image" and "image" in p)
            content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
        return cls(
            role=data["role"],
            content=content,
            tool_calls=calls,
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
            images=images,
        )


@pickled_as_tuple
@dataclass(frozen=True, slots=True)
class Task:
    """One dataset row: a stable id plus the env-specific fields (question, answer, …)."""

    id: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise TrajectoryError(f"task id must be a non-empty str, got {self.id!r}")
        object.__setattr__(self, "data", _freeze(self.data))


@pickled_as_tuple
@dataclass(frozen=True, slots=True)
class Completion:
    """What an engine returns for one request: sampled ids, their logprobs, why it stopped.

    ``versions`` (engines whose weights change during training) gives, per sampled token, the
    policy version of the weights that sampled it; empty when the engine does not track one.
    A request interrupted by a weight update and resumed has two runs of versions."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("token_ids", "logprobs", "versions"):
            if type(getattr(self, name)) is not tuple:  # engines mostly hand tuples already
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if len(self.token_ids) != len(self.logprobs):
            raise TrajectoryError(
                f"completion has {len(self.token_ids)} token ids but {len(self.logprobs)} "
                "logprobs; an engine must return one logprob per sampled token"
            )
        if self.versions and len(self.versions) != len(self.token_ids):
            raise TrajectoryError(
                f"completion has {len(self.token_ids)} token ids but {len(self.versions)} "
                "policy versions; give one version per sampled token, or none"
            )


class StopReason(enum.StrEnum):
    """Why an episode ended. Every trajectory carries exactly one."""

    DONE = "done"  # the env terminated the episode (an answer was given and scored)
    TRUNCATED = "truncated"  # the env truncated the episode (its own limit)
    MAX_TURNS = "max_turns"  # the rollout's turn limit was reached
    MAX_TOKENS = "max_tokens"  # the response token budget was used up
    CONTEXT_OVERFLOW = "context_overflow"  # the prompt or an observation does not fit
    TIMEOUT = "timeout"  # the per-trajectory deadline passed
    TOOL_FATAL = "tool_fatal"  # a tool raised ToolFatalError
    ENGINE_ERROR = "engine_error"  # the inference engine failed
    ENV_ERROR = "env_error"  # reset/step/reward raised

    @property
    def is_error(self) -> bool:
        return self in _ERROR_STOPS


#: Tool-error metrics that say a service failed (the sandbox, a search server), not that the
#: model called a tool wrongly (invalid_json, unknown_tool, invalid_arguments: the policy's to learn
#: from).
SERVICE_TOOL_ERRORS = ("tool_error/tool_exception", "tool_error/timeout")

_ERROR_STOPS = frozenset(
    {StopReason.TIMEOUT, StopReason.TOOL_FATAL, StopReason.ENGINE_ERROR, StopReason.ENV_ERROR}
)


@pickled_as_tuple
@dataclass(frozen=True, slots=True)
class Turn:
    """Per-turn record: where the turn's tokens sit in the trajectory and what it cost."""

    index: int
    start: int  # offset of this turn's first sampled token in Trajectory.token_ids
    completion_tokens: int
    observation_tokens: int
    finish_reason: FinishReason
    tool_calls: int = 0
    tool_errors: int = 0
    gen_latency_s: float = 0.0
    env_latency_s: float = 0.0
    reward: float = 0.0  # what env.step returned for this turn; the turns sum to the reward


@pickled_as_tuple
@dataclass(frozen=True, slots=True)
class Verdict:
    """Why an episode's answer was scored right or wrong: the ``answer`` extracted (None when
    there was none), the ``gold`` answer, the decision, ``by`` what check (``numeric``,
    ``exact``, ``math-verify``, ``timeout``, ``no answer``, …) and a one-line ``detail``.
    The env's reward gives it; the trajectory and the viewer carry it."""

    answer: str | None
    gold: str
    correct: bool
    by: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in _VERDICT_FIELDS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        return cls(**{f: data[f] for f in _VERDICT_FIELDS if f in data})


_VERDICT_FIELDS = ("answer", "gold", "correct", "by", "detail")


@dataclass(frozen=True)
class Trajectory:
    """One finished episode, token-exact.

    ``token_ids[:prompt_len]`` is the rendered initial prompt. After it come, per turn, the ids the
    engine sampled (``loss_mask`` 1, the engine's logprobs) and the observation's template suffix
    (``loss_mask`` 0, logprob 0.0). ``len(token_ids) == len(loss_mask) == len(logprobs)`` always.
    A failed episode is still a Trajectory: ``stop_reason.is_error`` and ``error`` say why.

    ``images`` are the PIL images the token ids show, in order; ``image_grids`` gives each one's
    patch grid ``(t, h, w)`` (what a VLM needs beside the pixels; see ``agentloop.vision``).

    ``versions`` holds, per token, the policy version that sampled it (-1 for tokens not
    sampled: prompt and observations); empty when the engine reports no versions.

    ``verdict`` (envs that grade an answer) says what answer was read and why it scored so.
    """

    task_id: str
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_len: int
    reward: float
    stop_reason: StopReason
    turns: tuple[Turn, ...] = ()
    messages: tuple[Message, ...] = ()
    metrics: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None
    sample_index: int = 0
    images: tuple[Any, ...] = ()
    image_grids: tuple[tuple[int, int, int], ...] = ()
    versions: tuple[int, ...] = ()
    verdict: Verdict | None = None

    def __post_init__(self) -> None:
        for name in (
            "token_ids",
            "loss_mask",
            "logprobs",
            "turns",
            "messages",
            "images",
            "versions",
        ):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        grids = tuple(tuple(int(v) for v in g) for g in self.image_grids)
        object.__setattr__(self, "image_grids", grids)
        if grids and (len(grids) != len(self.images) or any(len(g) != 3 for g in grids)):
            raise TrajectoryError(
                f"trajectory {self.task_id!r}: {len(grids)} image grids for {len(self.images)} "
                "images; give one (t, h, w) grid per image, or none"
            )
        object.__setattr__(self, "metrics", _freeze(self.metrics))
        n, m, k = len(self.token_ids), len(self.loss_mask), len(self.logprobs)
        if not n == m == k:
            raise TrajectoryError(
                f"trajectory {self.task_id!r}: token_ids ({n}), loss_mask ({m}) and logprobs ({k}) "
                "must have the same length"
            )
        if self.versions and len(self.versions) != n:
            raise TrajectoryError(
                f"trajectory {self.task_id!r}: {len(self.versions)} policy versions for {n} "
                "tokens; give one per token (-1 where not sampled), or none"
            )
        if not 0 <= self.prompt_len <= n:
            raise TrajectoryError(
                f"trajectory {self.task_id!r}: prompt_len {self.prompt_len} outside [0, {n}]"
            )
        mask = self.loss_mask  # counted in C: this check runs on every trajectory built
        if mask.count(0) + mask.count(1) != len(mask):
            raise TrajectoryError(f"trajectory {self.task_id!r}: loss_mask values must be 0 or 1")
        if any(self.loss_mask[: self.prompt_len]):
            raise TrajectoryError(
                f"trajectory {self.task_id!r}: prompt tokens must have loss_mask 0"
            )

    @property
    def response_ids(self) -> tuple[int, ...]:
        """Everything after the prompt: sampled and observation tokens, interleaved."""
        return self.token_ids[self.prompt_len :]

    @property
    def turn_rewards(self) -> tuple[float, ...]:
        """The reward of each turn, in order (``env.step``'s); they sum to ``reward``."""
        return tuple(t.reward for t in self.turns)

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def failed(self) -> bool:
        return self.stop_reason.is_error

    @property
    def service_failed(self) -> bool:
        """A service the run relies on failed this episode, not the policy: an error stop
        reason, or a tool call that failed with a tool exception or a timeout (a dead sandbox
        or search server turns every call into one). Eval's exit code and training's run guard
        count this."""
        return self.failed or any(self.metrics.get(k, 0.0) for k in SERVICE_TOOL_ERRORS)

    @property
    def trained_versions(self) -> tuple[int, ...]:
        """The policy versions of the trained (``loss_mask`` 1) tokens; empty when unknown."""
        if not self.versions:
            return ()
        return tuple(v for v, m in zip(self.versions, self.loss_mask, strict=True) if m)


@dataclass(frozen=True)
class TrajectoryGroup:
    """The ``n`` samples of one task (a GRPO group). ``rewards_G`` is ordered by sample index."""

    task: Task
    trajectories: tuple[Trajectory, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        trajectories = tuple(sorted(self.trajectories, key=lambda t: t.sample_index))
        object.__setattr__(self, "trajectories", trajectories)
        for t in trajectories:
            if t.task_id != self.task.id:
                raise TrajectoryError(
                    f"group of task {self.task.id!r} holds a trajectory of task {t.task_id!r}"
                )

    @property
    def rewards_G(self) -> tuple[float, ...]:
        return tuple(t.reward for t in self.trajectories)

    def __len__(self) -> int:
        return len(self.trajectories)
