"""One proxied episode: token-exact assembly of an agent's requests into trajectory segments.

Each request's conversation is compared, message by message, with what the episode's current
segment already holds (its messages, the last reply as the model wrote it). A request that only
appends messages after the last reply, and whose full rendering by the chat template is exactly
the segment's text followed by the new messages' suffix, extends the segment token-exactly, as
the rollout loop does: the sampled ids stay as sampled and the new messages are appended as the
template's token-level suffix (``loss_mask`` 0). Any other request (edited or dropped messages,
other tools, a template that renders earlier turns differently, a first request) starts a new
segment from a fresh render; nothing is ever re-tokenized into an existing segment. Every
segment becomes one :class:`~agentloop.types.Trajectory`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentloop.chat import TokenBuilder
from agentloop.engines.base import SamplingParams
from agentloop.errors import ConfigError
from agentloop.proxy import render
from agentloop.proxy.errors import ProxyRequestError
from agentloop.proxy.openai_api import AssistantKey, assistant_key
from agentloop.proxy.records import EpisodeLimits, EpisodeSampling, TextBounds
from agentloop.proxy.validate import check_token_ids
from agentloop.tools import ToolSchemas, get_parser
from agentloop.types import Completion, Message, StopReason, ToolCall, Trajectory, Turn

__all__ = ["Episode", "EpisodeLimits", "EpisodeSampling", "Prepared", "Reply", "TextBounds"]

BuilderFor = Callable[[Sequence[Mapping[str, Any]]], TokenBuilder]


@dataclass
class _Segment:
    """Token state of one segment (one future trajectory)."""

    tools_key: str
    token_ids: list[int]
    prompt_len: int
    messages: list[Message]
    text_mode: bool = False  # built from /v1/completions prompts, compared as token ids
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] | None = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    last_sampled: tuple[int, ...] | None = None
    sampled: int = 0

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        self.loss_mask, self.logprobs = [0] * n, [0.0] * n
        if self.versions is not None:
            self.versions = [-1] * n

    def append_observation(self, ids: Sequence[int]) -> None:
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        if self.versions is not None:
            self.versions += [-1] * len(ids)

    def append_sample(self, c: Completion) -> None:
        self.token_ids += c.token_ids
        self.loss_mask += [1] * len(c.token_ids)
        self.logprobs += c.logprobs
        if self.versions is not None:
            self.versions = self.versions + list(c.versions) if c.versions else None
        self.last_sampled = c.token_ids
        self.sampled += len(c.token_ids)


@dataclass(frozen=True)
class Prepared:
    """What to send the engine for one request, and how to commit its answer."""

    segment: _Segment
    new_segment: bool
    extra_ids: tuple[int, ...]  # appended to an extended segment before the sample
    extra_messages: tuple[Message, ...]
    prompt_ids: list[int]
    sampling: SamplingParams
    builder: TokenBuilder


@dataclass(frozen=True)
class Reply:
    """The parsed answer of one request: raw text, visible content, tool calls (with ids)."""

    text: str
    content: str
    calls: tuple[ToolCall, ...]
    completion: Completion


class Episode:
    """Everything the proxy records for one episode id; requests are served one at a time."""

    def __init__(
        self,
        episode_id: str,
        builder_for: BuilderFor,
        limits: EpisodeLimits,
        sampling: EpisodeSampling,
        *,
        parser: str = "hermes",
        bounds: TextBounds | None = None,
    ) -> None:
        self.id = episode_id
        self.bounds = bounds
        self.builder_for = builder_for
        self.limits, self.sampling = limits, sampling
        self.parser_name, self.parser = parser, get_parser(parser)
        self.lock = asyncio.Lock()  # one request at a time: the assembly is sequential
        self.segments: list[_Segment] = []
        self.requests = 0
        self.sampled = 0  # tokens sampled in all segments
        self.limit_hit: StopReason | None = None
        self._raw: dict[AssistantKey, str] = {}  # wire form of a reply -> what the model wrote
        self._call_prefix = secrets.token_hex(4)  # tool-call ids: nothing of the episode id
        #: /v1/responses: response id -> its conversation (for previous_response_id)
        self.responses: dict[str, tuple[Message | AssistantKey, ...]] = {}

    # -- assembly ----------------------------------------------------------------------------
    def _check_turns(self) -> None:
        """Refuse a request past ``max_turns``. A request counts once it is sent to the engine
        (:meth:`_prepared`): a refused one (malformed, too long) uses no turn."""
        if self.requests >= self.limits.max_turns:
            self.limit_hit = StopReason.MAX_TURNS
            raise ProxyRequestError(
                f"episode {self.id!r} reached its limit of {self.limits.max_turns} model "
                "requests (max_turns); finish with the answer you have",
                code="max_turns_exceeded",
            )

    def _check_chars(self, text: str, limit: int, what: str, *, budget: bool = False) -> None:
        """Refuse ``text`` untokenized if it cannot encode to ``limit`` tokens (see
        :class:`TextBounds`): the same refusal as after tokenizing, without the cost. ``budget``:
        ``limit`` is what the response budget has left (a MAX_TOKENS stop)."""
        most = limit * (self.bounds.max_token_chars if self.bounds else len(text))
        if len(text) <= most:
            return
        self.limit_hit = StopReason.MAX_TOKENS if budget else StopReason.CONTEXT_OVERFLOW
        left = (
            f"the {max(limit, 0)} tokens this episode has left (max_response_len "
            f"{self.limits.max_response_len}, context limit {self.limits.max_context}) can "
            f"spell at most {max(most, 0)}: none are left to generate for it"
            if budget
            else f"more than this episode's limit of {limit} tokens can spell (at most {most} "
            "characters); shorten the conversation or cut big tool outputs"
        )
        raise ProxyRequestError(
            f"{what} has {len(text)} characters, {left}",
            param="messages",
            code="context_length_exceeded",
        )

    def _resolve(self, messages: Sequence[Message | AssistantKey]) -> list[Message]:
        """Assistant messages back to the model's raw text (a reply the proxy gave) or, for
        one the agent wrote itself, to the template's tool-call markup."""
        out = []
        for i, m in enumerate(messages):
            if isinstance(m, Message):
                out.append(m)
                continue
            raw = self._raw.get(m)
            if raw is None and m[1] and self.parser_name != "hermes":
                raise ProxyRequestError(
                    f"messages[{i}] is an assistant message with tool calls that this proxy did "
                    f"not return; it can write such calls only for the hermes format, and this "
                    f"model uses {self.parser_name!r}: send replies back as received",
                    param=f"messages[{i}].tool_calls",
                )
            out.append(Message("assistant", raw if raw is not None else render.markup(m, i)))
        return out

    def prepare_chat(
        self,
        messages: Sequence[Message | AssistantKey],
        tools: Sequence[Mapping[str, Any]],
        max_tokens: int | None,
        temperature: float | None,
        top_p: float | None,
    ) -> Prepared:
        """The prompt of one chat request: the current segment extended, or a new segment.
        Its heavy part (rendering, tokenizing) runs on a worker thread: the proxy calls it in
        one."""
        self._check_turns()
        resolved = self._resolve(messages)
        if resolved[-1].role == "assistant":
            raise ProxyRequestError(
                "the last message is an assistant message; continuing a reply is not "
                "supported: end with a user or tool message",
                param=f"messages[{len(resolved) - 1}]",
            )
        tools_key = render.tools_key(tools)
        builder = self.builder_for(list(tools))
        seg = self.segments[-1] if self.segments else None
        extended = self._extension(seg, resolved, tools_key, builder)
        if extended is not None:
            assert seg is not None
            new, extra = resolved[len(seg.messages) :], extended
            prompt = seg.token_ids + list(extra)
            prepared_seg, is_new = seg, False
        else:
            limit = self.limits.max_prompt_len if not self.segments else self.limits.max_context
            text = render.rendered(builder, resolved)
            self._check_chars(text, limit, "the rendered prompt")
            prompt = render.encoded(builder, text, resolved)
            self._check_len(len(prompt), limit, "the rendered prompt")
            prepared_seg = _Segment(tools_key, list(prompt), len(prompt), list(resolved))
            new, extra, is_new = [], (), True
        return self._prepared(
            prepared_seg, is_new, extra, new, prompt, builder, max_tokens, temperature, top_p
        )

    def _extension(
        self,
        seg: _Segment | None,
        messages: Sequence[Message],
        tools_key: str,
        builder: TokenBuilder,
    ) -> tuple[int, ...] | None:
        """The observation ids that extend ``seg`` to ``messages``, or None for a new segment.

        Two checks: the messages are the segment's conversation plus new non-assistant ones,
        and the template's full rendering of ``messages`` is, as text, exactly the segment's
        ids (prompt and sampled replies, untouched) followed by those observation ids. The
        second catches templates that render earlier turns differently once the conversation
        goes on (one that strips ``<think>`` blocks from earlier replies): their request is not
        what the model saw, so it gets a fresh render in a new segment. Text, not ids, is
        compared: a sample the tokenizer would spell with other ids is still the same context.
        """
        if seg is None or not _extends(seg, messages, tools_key):
            return None
        assert seg.last_sampled is not None
        new = messages[len(seg.messages) :]
        text = render.observation_text(builder, new, seg.last_sampled)
        used = len(seg.token_ids) - seg.prompt_len + self.sampled - seg.sampled
        left = min(
            self.limits.max_context - len(seg.token_ids), self.limits.max_response_len - used
        )
        self._check_chars(text, left, "the new messages' text", budget=True)
        extra = tuple(render.encoded(builder, text, new))
        return extra if render.renders_as(builder, [*seg.token_ids, *extra], messages) else None

    def prepare_text(
        self,
        prompt: str | tuple[int, ...],
        max_tokens: int | None,
        temperature: float | None,
        top_p: float | None,
    ) -> Prepared:
        """The prompt of one ``/v1/completions`` request, compared as token ids."""
        self._check_turns()
        builder = self.builder_for([])
        limit = self.limits.max_prompt_len if not self.segments else self.limits.max_context
        if isinstance(prompt, str):
            self._check_chars(prompt, limit, "the prompt")
            ids = builder.encode(prompt)
        else:
            self._check_len(len(prompt), limit, "the prompt")
            vocab = self.bounds.vocab_size if self.bounds else len(builder.tokenizer)
            check_token_ids(prompt, vocab)
            ids = list(prompt)
        seg = self.segments[-1] if self.segments else None
        if (
            seg is not None
            and seg.text_mode
            and seg.last_sampled is not None
            and len(ids) > len(seg.token_ids)
            and ids[: len(seg.token_ids)] == seg.token_ids
        ):
            extra = tuple(ids[len(seg.token_ids) :])
            return self._prepared(
                seg, False, extra, [], ids, builder, max_tokens, temperature, top_p
            )
        self._check_len(len(ids), limit, "the prompt")
        new_seg = _Segment("", list(ids), len(ids), [], text_mode=True)
        return self._prepared(new_seg, True, (), [], ids, builder, max_tokens, temperature, top_p)

    def _check_len(self, n: int, limit: int, what: str) -> None:
        if n > limit:
            self.limit_hit = StopReason.CONTEXT_OVERFLOW
            raise ProxyRequestError(
                f"{what} has {n} tokens, more than this episode's limit of {limit}; shorten "
                "the conversation",
                param="messages",
                code="context_length_exceeded",
            )

    def _prepared(
        self,
        seg: _Segment,
        is_new: bool,
        extra: tuple[int, ...],
        new: Sequence[Message],
        prompt: list[int],
        builder: TokenBuilder,
        max_tokens: int | None,
        temperature: float | None,
        top_p: float | None,
    ) -> Prepared:
        # tokens after the first prompt, as in the rollout loop: the segment's own, plus what
        # earlier segments sampled (a history rewrite does not renew the budget)
        used = len(prompt) - seg.prompt_len + self.sampled - (0 if is_new else seg.sampled)
        left = min(self.limits.max_context - len(prompt), self.limits.max_response_len - used)
        if left < 1:
            self.limit_hit = StopReason.MAX_TOKENS
            raise ProxyRequestError(
                f"the context has {len(prompt)} tokens and the episode used {used} of its "
                f"{self.limits.max_response_len} response tokens (max_response_len; context "
                f"limit {self.limits.max_context}): none are left to generate",
                param="messages",
                code="context_length_exceeded",
            )
        s = self.sampling
        if not s.fixed:
            s = EpisodeSampling(
                temperature=s.temperature if temperature is None else float(temperature),
                top_p=s.top_p if top_p is None else float(top_p),
                top_k=s.top_k,
                seed=s.seed,
            )
        turn = self.requests + 1
        seed = None if s.seed is None else s.seed * 1009 + turn
        try:
            sampling = SamplingParams(
                max_tokens=min(left, max_tokens or left, self.limits.max_turn_tokens or left),
                temperature=s.temperature,
                top_p=s.top_p,
                top_k=s.top_k,
                seed=seed,
                stop_token_ids=builder.stop_token_ids,
            )
        except ConfigError as exc:
            raise ProxyRequestError(str(exc), param="temperature") from exc
        self.requests = turn  # this request goes to the engine: it uses a turn
        return Prepared(seg, is_new, extra, tuple(new), prompt, sampling, builder)

    # -- committing an answer ----------------------------------------------------------------
    def commit(self, p: Prepared, completion: Completion, t0: float) -> Reply:
        """Record the engine's answer to ``p`` and parse it for the agent."""
        seg = p.segment
        if p.new_segment:
            self.segments.append(seg)
        else:
            seg.append_observation(p.extra_ids)
            seg.messages += p.extra_messages
            if seg.turns:  # the observation tokens belong to the turn before
                last = seg.turns[-1]
                seg.turns[-1] = _with_obs(last, len(p.extra_ids))
        start = len(seg.token_ids)
        seg.append_sample(completion)
        self.sampled += len(completion.token_ids)
        text = p.builder.decode(completion.token_ids)
        calls, content = self._parse(text, ToolSchemas.of(p.builder.tools))
        seg.turns.append(
            Turn(
                index=len(seg.turns),
                start=start,
                completion_tokens=len(completion.token_ids),
                observation_tokens=0,
                finish_reason=completion.finish_reason,
                tool_calls=len(calls),
                gen_latency_s=time.perf_counter() - t0,
            )
        )
        if not seg.text_mode:
            seg.messages.append(Message("assistant", text, calls))
            wire = [
                {"id": c.id, "function": {"name": c.name, "arguments": dict(c.arguments)}}
                for c in calls
            ]
            self._raw[assistant_key(content, wire)] = text
        return Reply(text, content, calls, completion)

    def _parse(self, text: str, tools: ToolSchemas) -> tuple[tuple[ToolCall, ...], str]:
        """Well-formed calls (with episode-unique ids, values typed by the request's ``tools``
        where the format is untyped) and the text around them; a malformed call stays in the
        visible content, so the agent sees what the model wrote."""
        good = [c for c in self.parser.parse(text, tools) if c.parse_error is None and c.raw]
        content = text
        for c in good:
            content = content.replace(c.raw, "", 1)
        n = sum(len(s.turns) for s in self.segments)
        calls = tuple(
            ToolCall(c.name, c.arguments, id=f"call_{self._call_prefix}_{n}_{k}", raw=c.raw)
            for k, c in enumerate(good)
        )
        return calls, content.strip()

    # -- results -----------------------------------------------------------------------------
    def trajectories(
        self,
        task_id: str,
        *,
        reward: float,
        stop_reason: StopReason,
        error: str | None = None,
        sample_index: int = 0,
    ) -> list[Trajectory]:
        """One trajectory per segment that sampled something (at least one, maybe empty)."""
        segs = [s for s in self.segments if s.turns]
        empty = Trajectory(
            task_id=task_id,
            token_ids=(),
            loss_mask=(),
            logprobs=(),
            prompt_len=0,
            reward=reward,
            stop_reason=stop_reason,
            error=error,
            sample_index=sample_index,
            metrics={"segments": 0.0, "segment_index": 0.0, "turns": 0.0},
        )
        return [
            replace(
                empty,
                token_ids=tuple(s.token_ids),
                loss_mask=tuple(s.loss_mask),
                logprobs=tuple(s.logprobs),
                prompt_len=s.prompt_len,
                turns=tuple(s.turns),
                messages=tuple(s.messages),
                versions=tuple(s.versions or ()),
                metrics=_metrics(s, k, len(segs)),
            )
            for k, s in enumerate(segs)
        ] or [empty]


def _metrics(s: _Segment, k: int, n: int) -> dict[str, float]:
    return {
        "turns": float(len(s.turns)),
        "response_tokens": float(len(s.token_ids) - s.prompt_len),
        "trained_tokens": float(s.loss_mask.count(1)),
        "gen_time_s": sum(t.gen_latency_s for t in s.turns),
        "tool_calls": float(sum(t.tool_calls for t in s.turns)),
        "segments": float(n),  # > 1: the agent rewrote its history (n - 1 times)
        "segment_index": float(k),
    }


def _with_obs(turn: Turn, n: int) -> Turn:
    return replace(turn, observation_tokens=turn.observation_tokens + n)


def _extends(seg: _Segment, messages: Sequence[Message], tools_key: str) -> bool:
    """Whether ``messages`` are the segment's conversation plus new non-assistant messages."""
    n = len(seg.messages)
    return (
        not seg.text_mode
        and seg.last_sampled is not None
        and seg.tools_key == tools_key
        and len(messages) > n
        and all(_same(a, b) for a, b in zip(messages, seg.messages, strict=False))
        and all(m.role != "assistant" for m in messages[n:])
    )


def _same(a: Message, b: Message) -> bool:
    """Equal as the template renders them (parsed tool calls live in the raw text)."""
    return (a.role, a.content, a.tool_call_id, a.name) == (
        b.role,
        b.content,
        b.tool_call_id,
        b.name,
    )
