"""A set of tools, its per-episode sessions, and dispatch of a turn's calls into results."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from agentloop.errors import ToolError, ToolFatalError, did_you_mean
from agentloop.tools.context import ToolContext
from agentloop.tools.recording import (
    CallKey,
    RecordedCall,
    ReplayMiss,
    ToolTape,
    current_episode,
    current_tape,
)
from agentloop.tools.runtime import (
    CANCEL_GRACE_S,
    DeadlineExceeded,
    SlotHold,
    call_with_deadline,
)
from agentloop.tools.tool import Tool
from agentloop.types import Message, Task, ToolCall

__all__ = ["ToolErrorKind", "ToolOutput", "ToolResult", "ToolSession", "Toolset"]

logger = logging.getLogger(__name__)
_UNBOUNDED: AbstractAsyncContextManager[Any] = contextlib.nullcontext()


class ToolErrorKind(enum.StrEnum):
    """Why a tool call produced an error result instead of the tool's output."""

    INVALID_JSON = "invalid_json"  # the call could not be parsed (ToolCall.parse_error)
    UNKNOWN_TOOL = "unknown_tool"  # no tool has that name
    INVALID_ARGUMENTS = "invalid_arguments"  # arguments missing, unexpected or of the wrong type
    TOOL_EXCEPTION = "tool_exception"  # the tool raised (or returned something not JSON-able)
    TIMEOUT = "timeout"  # the tool ran past its timeout_s
    REPLAY_MISS = "replay_miss"  # a replayed run met a call its recording does not hold


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """What a tool returns to show the model images (PIL), with optional text. A tool may also
    return a bare PIL image. The images become the ``tool`` message's image parts."""

    text: str = ""
    images: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "images", tuple(self.images))


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The outcome of one call, in call order. Errors are data: ``content`` starts with
    ``Error:`` and says what went wrong, so the model can read it and fix its next call."""

    call: ToolCall
    content: str
    error_kind: ToolErrorKind | None = None
    latency_s: float = 0.0
    images: tuple[Any, ...] = ()

    @property
    def is_error(self) -> bool:
        return self.error_kind is not None

    def to_message(self) -> Message:
        """The ``tool`` message answering the call."""
        return Message(
            role="tool",
            content=self.content,
            name=self.call.name or None,
            tool_call_id=self.call.id,
            images=self.images,
        )


class Toolset:
    """The tools of an env, by name. ``schemas`` go to the chat template's ``tools``.

    ``max_parallel`` bounds how many calls of one turn run at once. Results are not cut here:
    the rollout loop cuts tool output to ``RolloutConfig.max_tool_output_tokens`` (one limit, in
    tokens of the model's tokenizer).
    """

    def __init__(
        self,
        tools: Sequence[Tool],
        *,
        max_parallel: int = 8,
    ) -> None:
        if isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1:
            raise ToolError(f"Toolset max_parallel={max_parallel!r}; use an int >= 1")
        self._tools: dict[str, Tool] = {}
        for t in tools:
            if not isinstance(t, Tool):
                raise ToolError(
                    f"Toolset got {t!r}, which is not a Tool; decorate the function with @tool"
                )
            if t.name in self._tools:
                raise ToolError(
                    f"two tools are named {t.name!r}; give one another name with @tool(name=...)"
                )
            self._tools[t.name] = t
        self.max_parallel = max_parallel

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self._tools.values()]

    def get(self, name: str) -> Tool:
        """The tool called ``name``; ``ToolError`` with a close match if there is none."""
        try:
            return self._tools[name]
        except KeyError:
            raise ToolError(self.unknown_tool_message(name)) from None

    def unknown_tool_message(self, name: str) -> str:
        hint, available = did_you_mean(name, self._tools), ", ".join(self._tools) or "(none)"
        return f"unknown tool {name!r}.{hint} Available tools: {available}."

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def session(self, task: Any = None) -> ToolSession:
        """A per-episode session; use ``async with`` (or ``await session.aclose()`` at the end)."""
        return ToolSession(self, task)


class ToolSession:
    """One episode's use of a ``Toolset``: its ``ToolContext`` and dispatch.

    Closing the session (``async with`` exit or ``aclose()``) exits every resource the tools
    entered through ``context.enter``, also when the episode fails or is cancelled.

    When a run records or replays tool I/O (:mod:`agentloop.tools.recording`), the session
    takes the tape and the episode's identity as it opens, and every call that reaches a tool
    goes through the tape: this is the one place where record/replay hooks into dispatch.
    """

    def __init__(self, toolset: Toolset, task: Any = None) -> None:
        self.toolset = toolset
        self.context = ToolContext(task)
        self._tape = current_tape()
        self._episode = current_episode() or (task.id if isinstance(task, Task) else "", 0)
        self._turn = 0  # the episode's tool-calling turns so far (part of a recorded call's key)

    async def __aenter__(self) -> ToolSession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.context.aclose()

    async def dispatch(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Run a turn's calls concurrently (at most ``max_parallel`` at once); results in call
        order. Every failure becomes an error result; only ``ToolFatalError`` propagates (the
        other calls of the turn are then cancelled)."""
        if self.context.closed:
            raise ToolError("dispatch on a closed tool session; open a new one per episode")
        if not calls:
            return []
        turn, self._turn = self._turn, self._turn + 1
        if len(calls) == 1:  # the common turn: no task, gather or semaphore to set up
            return [await self._run(calls[0], _UNBOUNDED, turn, 0)]
        parallel = asyncio.Semaphore(self.toolset.max_parallel)
        tasks = [
            asyncio.ensure_future(self._run(call, parallel, turn, i))
            for i, call in enumerate(calls)
        ]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            pending = [t for t in tasks if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=CANCEL_GRACE_S)

    async def _run(
        self, call: ToolCall, parallel: AbstractAsyncContextManager[Any], turn: int, index: int
    ) -> ToolResult:
        start = time.perf_counter()
        content, kind = await self._execute(call, parallel, turn, index)
        if isinstance(content, ToolOutput):
            return ToolResult(call, content.text, kind, time.perf_counter() - start, content.images)
        return ToolResult(call, content, kind, time.perf_counter() - start)

    async def _execute(
        self, call: ToolCall, parallel: AbstractAsyncContextManager[Any], turn: int, index: int
    ) -> tuple[str | ToolOutput, ToolErrorKind | None]:
        if call.parse_error is not None:
            return f"Error: invalid tool call: {call.parse_error}", ToolErrorKind.INVALID_JSON
        t = self.toolset._tools.get(call.name)
        if t is None:
            return (
                f"Error: {self.toolset.unknown_tool_message(call.name)}",
                ToolErrorKind.UNKNOWN_TOOL,
            )
        try:
            kwargs = await t.bind_arguments_async(call.arguments)
        except ToolError as e:
            return f"Error: {e}", ToolErrorKind.INVALID_ARGUMENTS
        except DeadlineExceeded as e:  # a check that could not finish in time (MCP schemas)
            return f"Error: {e}", ToolErrorKind.TIMEOUT
        if t.context_param is not None:
            kwargs[t.context_param] = self.context
        if self._tape is not None:
            task_id, sample = self._episode
            key = CallKey(task_id, sample, turn, index, t.name, CallKey.canonical(call.arguments))
            return await self._taped(self._tape, key, t, kwargs, parallel)
        return await _live(t, kwargs, parallel)

    async def _taped(
        self,
        tape: ToolTape,
        key: CallKey,
        t: Tool,
        kwargs: dict[str, Any],
        parallel: AbstractAsyncContextManager[Any],
    ) -> tuple[str | ToolOutput, ToolErrorKind | None]:
        """Serve the call from the replayed recording (or apply the miss policy), or run it
        live; either way it is written to the recording, if one is being made."""
        schema = t.schema_sha256
        if tape.replaying:
            recorded = tape.lookup(key, schema)
            if recorded is not None:
                if not await tape.wait(recorded, t.timeout_s):  # slower than the tool may be
                    took = f"{recorded.latency_s:.3g}s"
                    text = (
                        f"Error: tool {t.name!r} timed out after {t.timeout_s}s (recorded: {took})"
                    )
                    recorded = RecordedCall(text, ToolErrorKind.TIMEOUT.value, t.timeout_s)
                tape.write(key, recorded, schema)
                kind = ToolErrorKind(recorded.error_kind) if recorded.error_kind else None
                if recorded.images:
                    return ToolOutput(recorded.content, recorded.images), kind
                return recorded.content, kind
            if tape.config.miss is ReplayMiss.FAIL:
                raise ToolFatalError(tape.miss_error(key))
            if tape.config.miss is ReplayMiss.ERROR:
                return f"Error: {tape.miss_error(key)}", ToolErrorKind.REPLAY_MISS
        start = time.perf_counter()
        content, kind = await _live(t, kwargs, parallel)
        latency = time.perf_counter() - start
        out = content if isinstance(content, ToolOutput) else ToolOutput(content)
        tape.write(
            key, RecordedCall(out.text, kind.value if kind else None, latency, out.images), schema
        )
        return content, kind


async def _live(
    t: Tool, kwargs: dict[str, Any], parallel: AbstractAsyncContextManager[Any]
) -> tuple[str | ToolOutput, ToolErrorKind | None]:
    """Run the tool under its limits: its concurrency and rate limits, the turn's parallelism."""
    if parallel is _UNBOUNDED and t.limiter.unlimited:  # the common call: no async-with
        return await _call(t, kwargs)
    async with t.limiter.slot() as hold, parallel:
        return await _call(t, kwargs, hold)


async def _call(
    t: Tool, kwargs: dict[str, Any], hold: SlotHold | None = None
) -> tuple[str | ToolOutput, ToolErrorKind | None]:
    """Run the tool under its deadline; every failure but ``ToolFatalError`` becomes a result.
    A call abandoned at its deadline keeps ``hold``'s slot until its work really ends."""
    try:
        value = await call_with_deadline(
            t.fn,
            kwargs,
            is_async=t.is_async,
            timeout_s=t.timeout_s,
            name=t.name,
            keep=hold.keep if hold is not None else None,
        )
    except ToolFatalError:
        raise
    except DeadlineExceeded as e:
        return f"Error: {e}", ToolErrorKind.TIMEOUT
    except ToolError as e:
        return f"Error: tool {t.name!r} failed: {e}", ToolErrorKind.TOOL_EXCEPTION
    except (Exception, SystemExit) as e:
        logger.debug("tool %r raised", t.name, exc_info=True)
        detail = f": {e}" if str(e) else ""
        return (
            f"Error: tool {t.name!r} raised {type(e).__name__}{detail}",
            ToolErrorKind.TOOL_EXCEPTION,
        )
    return _render(t.name, value)


def _render(name: str, value: Any) -> tuple[str | ToolOutput, ToolErrorKind | None]:
    """A tool's return value as observation text: str as-is, images as a ``ToolOutput``,
    anything else as JSON."""
    if isinstance(value, str | ToolOutput):
        return value, None
    if hasattr(value, "save") and hasattr(value, "mode"):  # a PIL image, without importing PIL
        return ToolOutput("", (value,)), None
    try:
        return json.dumps(value, ensure_ascii=False), None
    except (TypeError, ValueError):
        return (
            f"Error: tool {name!r} returned a {type(value).__name__}, which is not "
            "JSON-serializable; the tool must return a str or JSON-able data",
            ToolErrorKind.TOOL_EXCEPTION,
        )
