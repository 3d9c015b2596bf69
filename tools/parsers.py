"""Tool-call parsers (assistant text → ``ToolCall``s) and their registry; ships ``hermes``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

from agentloop.errors import ToolError, did_you_mean
from agentloop.tools.arg_types import NO_TOOLS, ToolSchemas
from agentloop.types import ToolCall

__all__ = [
    "HermesParser",
    "ToolCallParser",
    "available_parsers",
    "detect_parser",
    "get_parser",
    "register_parser",
]


@runtime_checkable
class ToolCallParser(Protocol):
    """Extracts the tool calls from one assistant message.

    ``parse`` never raises and never drops a call: a call it cannot read becomes a ``ToolCall``
    with ``parse_error`` set (and ``name`` if it could be recovered), which the dispatcher turns
    into an ``invalid_json`` error result for the model.

    ``tools`` are the schemas of the tools the model was shown (as vLLM's parsers get the
    request's tools): a format that writes values as bare text types each by its parameter's
    schema (:class:`~agentloop.tools.arg_types.ToolSchemas`); a JSON format ignores them.
    """

    def parse(self, text: str, tools: ToolSchemas = NO_TOOLS) -> tuple[ToolCall, ...]: ...


P = TypeVar("P", bound=Callable[[], ToolCallParser])
_PARSERS: dict[str, Callable[[], ToolCallParser]] = {}
_MARKERS: dict[str, tuple[str, ...]] = {}  # parser name → what a template of its format contains


def register_parser(name: str, *, markers: tuple[str, ...] = ()) -> Callable[[P], P]:
    """Register a parser class (or zero-argument factory) under ``name``::

    @register_parser("my_format", markers=("<call>",))
    class MyParser:
        def parse(self, text: str, tools: ToolSchemas = NO_TOOLS) -> tuple[ToolCall, ...]: ...

    ``markers`` are strings a chat template of this format contains, all of them: with them,
    ``rollout.parser=auto`` picks this parser for such a template (:func:`detect_parser`).
    """

    def decorate(factory: P) -> P:
        existing = _PARSERS.get(name)
        if existing is not None and existing is not factory:
            raise ToolError(
                f"a tool-call parser named {name!r} is already registered ({existing!r}); "
                "choose another name"
            )
        _PARSERS[name] = factory
        if markers:
            _MARKERS[name] = tuple(markers)
        return factory

    return decorate


def detect_parser(chat_template: str) -> str | None:
    """The parser whose format ``chat_template`` renders, or None: of the parsers whose every
    declared marker is in the template, the one with the most markers (formats that reuse
    ``<tool_call>`` declare it and their own tags, so they win over plain hermes). Two such
    parsers with as many markers are an error naming them: set ``rollout.parser``."""
    found = [(len(m), n) for n, m in _MARKERS.items() if all(x in chat_template for x in m)]
    if not found:
        return None
    most = max(count for count, _ in found)
    best = sorted(n for count, n in found if count == most)
    if len(best) > 1:
        raise ToolError(
            f"the chat template has the markers of several tool-call formats: {', '.join(best)}; "
            "set rollout.parser to the one the model writes"
        )
    return best[0]


def available_parsers() -> list[str]:
    return sorted(_PARSERS)


def get_parser(name: str) -> ToolCallParser:
    """A new instance of the parser registered as ``name``."""
    factory = _PARSERS.get(name)
    if factory is None:
        raise ToolError(
            f"unknown tool-call parser {name!r}.{did_you_mean(name, _PARSERS)} Registered parsers: "
            f"{', '.join(available_parsers())}; add one with @register_parser(name)"
        )
    return factory()


_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_NAME_RE = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_DECODER = json.JSONDecoder()


_WS_RUN = re.compile(r"[ \t\r\n]*")


def _skip_ws(text: str, pos: int) -> int:
    match = _WS_RUN.match(text, pos)  # a scan in C; `*` always matches
    return match.end() if match else pos


def _guess_name(body: str) -> str:
    """The ``"name"`` of a call whose JSON is broken, if it can still be read."""
    match = _NAME_RE.search(body)
    if not match:
        return ""
    try:
        name = json.loads(f'"{match.group(1)}"')
    except ValueError:
        return ""
    return name if isinstance(name, str) else ""


def _json_error(e: Exception) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"invalid JSON ({e.msg} at line {e.lineno} column {e.colno})"
    return f"invalid JSON ({type(e).__name__})"  # RecursionError on absurdly deep nesting


def _call_from_object(obj: Any, index: int, raw: str) -> ToolCall:
    """Check the decoded JSON of one block and build its ``ToolCall``."""
    call_id = f"call_{index}"
    if not isinstance(obj, dict):
        return ToolCall(
            name="",
            id=call_id,
            raw=raw,
            parse_error=f'expected a JSON object {{"name": ..., "arguments": {{...}}}}, '
            f"got a JSON {type(obj).__name__}",
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        if name is None:
            problem = '"name" is missing'
        elif isinstance(name, str):
            problem = '"name" is empty'
        else:
            problem = f'"name" must be a string, got {json.dumps(name)}'
        return ToolCall(name="", id=call_id, raw=raw, parse_error=f"{problem} in the tool call")
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            args = None
        if not isinstance(args, dict):
            return ToolCall(
                name=name,
                id=call_id,
                raw=raw,
                parse_error='"arguments" is a string that does not hold a JSON object; '
                'give "arguments" as an object, e.g. {"x": 1}',
            )
    if not isinstance(args, dict):
        return ToolCall(
            name=name,
            id=call_id,
            raw=raw,
            parse_error=f'"arguments" must be a JSON object, got a JSON {type(args).__name__}',
        )
    return ToolCall(name=name, arguments=args, id=call_id, raw=raw)


@register_parser("hermes", markers=("<tool_call>",))
class HermesParser:
    """Hermes/Qwen format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` per call.

    Text around the blocks is ignored. Ids are ``call_0``, ``call_1``, … in order of appearance.
    The JSON is decoded first (so ``</tool_call>`` inside a string value does not end the block);
    a block whose JSON is broken ends at the next ``</tool_call>``. A ``<tool_call>`` without a
    closing tag (before the next ``<tool_call>`` or the end of the text) is an error call.
    The arguments are JSON: ``tools`` are not needed to type them.
    """

    def parse(self, text: str, tools: ToolSchemas = NO_TOOLS) -> tuple[ToolCall, ...]:
        if not isinstance(text, str):
            text = str(text)
        calls: list[ToolCall] = []
        pos = text.find(_OPEN)
        while pos != -1:
            call, end = self._parse_block(text, pos, len(calls))
            calls.append(call)
            pos = text.find(_OPEN, end)
        return tuple(calls)

    def _parse_block(self, text: str, start: int, index: int) -> tuple[ToolCall, int]:
        """Parse the block opening at ``start``; return its call and where the block ends."""
        body_start = start + len(_OPEN)
        json_start = _skip_ws(text, body_start)
        try:
            obj, json_end = _DECODER.raw_decode(text, json_start)
        except (ValueError, RecursionError):
            obj, json_end = None, -1
        if json_end != -1:
            close = _skip_ws(text, json_end)
            if text.startswith(_CLOSE, close):
                end = close + len(_CLOSE)
                return _call_from_object(obj, index, text[start:end]), end
        close = text.find(_CLOSE, body_start)
        next_open = text.find(_OPEN, body_start)
        if close == -1 or (next_open != -1 and next_open < close):
            end = len(text) if next_open == -1 else next_open
            raw = text[start:end]
            reason = (
                "unclosed <tool_call>: the call has no </tool_call> (was the reply cut off?); "
                "write each call as <tool_call>{...}</tool_call>"
            )
            return ToolCall(
                name=_guess_name(raw), id=f"call_{index}", raw=raw, parse_error=reason
            ), end
        end = close + len(_CLOSE)
        body, raw = text[body_start:close], text[start:end]
        if not body.strip():
            error = "empty <tool_call></tool_call> block"
        else:
            try:  # again on the body alone, so the error position is within the block
                return _call_from_object(json.loads(body), index, raw), end
            except (ValueError, RecursionError) as e:
                error = _json_error(e)
        call = ToolCall(name=_guess_name(body), id=f"call_{index}", raw=raw, parse_error=error)
        return call, end
