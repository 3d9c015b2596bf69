"""Tool-call parsers of the model families beyond hermes, and the parser a chat template implies.

Each parser reads the format its family's documentation gives for assistant tool calls:

- ``llama3_json`` (Llama 3.1-3.3): ``{"name": "f", "parameters": {...}}``, after an optional
  ``<|python_tag|>``; several joined by ``;``.
- ``mistral`` (Mistral, Ministral, Mixtral): ``[TOOL_CALLS]f[ARGS]{...}`` (v11+), or
  ``[TOOL_CALLS][{"name": "f", "arguments": {...}}]`` (v3).
- ``harmony`` (gpt-oss): ``<|channel|>commentary to=functions.f <|constrain|>json<|message|>
  {...}<|call|>``.
- ``glm45`` (GLM-4.5/4.6): ``<tool_call>f`` ``<arg_key>k</arg_key><arg_value>v</arg_value>``
  ``</tool_call>``.
- ``qwen3_coder`` (Qwen3-Coder): ``<tool_call><function=f><parameter=k>v</parameter>``
  ``</function></tool_call>``.
- ``deepseek_v3`` (DeepSeek-V3, V3.1, R1-0528): ``<｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}``
  ``<｜tool▁call▁end｜>`` (V3.1), or ``function<｜tool▁sep｜>f`` + a fenced JSON block (V3).

Like ``hermes``, a parser never raises and never drops a call: unreadable arguments give a
``ToolCall`` with ``parse_error``. Parameter values of the XML formats (``glm45``,
``qwen3_coder``) are bare text: each is typed by its parameter's schema in the ``tools`` the
parser is given (:class:`~agentloop.tools.arg_types.ToolSchemas`, vLLM's rules), and stays a
string where no schema names it. The JSON formats keep the types the model wrote.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentloop.errors import ToolError
from agentloop.tools.arg_types import NO_TOOLS, ToolSchemas
from agentloop.tools.parsers import (
    _DECODER,
    _call_from_object,
    available_parsers,
    detect_parser,
    register_parser,
)
from agentloop.types import ToolCall

__all__ = [
    "DeepSeekV3Parser",
    "Glm45Parser",
    "HarmonyParser",
    "Llama3JsonParser",
    "MistralParser",
    "Qwen3CoderParser",
    "detect_parser",
    "resolve_parser",
]


def _args_call(name: str, args_text: str, index: int, raw: str) -> ToolCall:
    """A call whose arguments are a JSON object written as text."""
    text = args_text.strip()
    try:
        args: Any = json.loads(text) if text else {}
    except (ValueError, RecursionError) as e:
        reason = getattr(e, "msg", type(e).__name__)
        return ToolCall(
            name=name, id=f"call_{index}", raw=raw, parse_error=f"invalid JSON arguments ({reason})"
        )
    return _call_from_object({"name": name, "arguments": args}, index, raw)


@register_parser("llama3_json", markers=("<|start_header_id|>", "ipython"))
class Llama3JsonParser:
    """Llama 3.x JSON tool calls: the whole reply is ``{"name": ..., "parameters": {...}}``
    (``"arguments"`` accepted too), optionally after ``<|python_tag|>``; several calls are
    joined by ``;``. A reply that does not start with ``{`` is a plain answer (no calls)."""

    def parse(self, text: str, tools: ToolSchemas = NO_TOOLS) -> tuple[ToolCall, ...]:
        body = str(text).strip().removeprefix("<|python_tag|>").strip()
        calls: list[ToolCall] = []
        pos = 0
        while pos < len(body) and body[pos] == "{":
            try:
                obj, end = _DECODER.raw_decode(body, pos)
            except (ValueError, RecursionError) as e:
                raw = body[pos:]
                reason = getattr(e, "msg", type(e).__name__)
                calls.append(
                    ToolCall(
                        name="",
                        id=f"call_{len(calls)}",
                        raw=raw,
                        parse_error=f"invalid JSON ({reason})",
                    )
                )
                break
            if isinstance(obj, dict) and "parameters" in obj and "arguments" not in obj:
                obj = {"name": obj.get("name"), "arguments": obj["parameters"]}
            calls.append(_call_from_object(obj, len(calls), body[pos:end]))
            pos = end
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
        return tuple(calls)


_MISTRAL_V11 = re.compile(r"\[TOOL_CALLS\]\s*([^\[\]\s{]+)\s*\[ARGS\]")


@register_parser("mistral", markers=("[AVAILABLE_TOOLS]",))
class MistralParser:
    """Mistral tool calls: ``[TOOL_CALLS]name[ARGS]{...}`` per call (tokenizer v11+), or one
    ``[TOOL_CALLS]`` followed by a JSON list of ``{"name", "arguments"}`` objects (v3)."""

    def parse(self, text: str, tools: ToolSchemas = NO_TOOLS) -> tuple[ToolCall, ...]:
        text = str(text)
        calls: list[ToolCall] = []
        for match in _MISTRAL_V11.finditer(text):
            try:
                args, end = _DECODER.raw_decode(text, match.end())
                raw = text[match.start() : end]
                calls.append(
                    _call_from_object({"name": match[1], "arguments": args}, len(calls), raw)
                )
            except (ValueError, RecursionError):
                calls.append(
                    _args_call(match[1], text[match.end() :], len(calls), text[match.start() :])
                )
        if calls:
            return tuple(calls)
        at = text.find("[TOOL_CALLS]")
        if at < 0:
            return ()
        body_at = at + len("[TOOL_CALLS]")
        body_at += len(text[body_at:]) - len(text[body_at:].lstrip())
        try:
            objs, _ = _DECODER.raw_decode(text, body_at)
        except (ValueError, RecursionError) as e:
            reason = getattr(e, "msg", type(e).__name__)
            return (
                ToolCall(
                    name="", id="call_0", raw=text[at:], parse_error=f"invalid JSON ({reason})"
                ),
            )
        objs = objs if isinstance(objs, list) else [objs]
        return tuple(_call_from_object(o, i, text[at:]) for i, o in enumerate(objs))


_HARMONY_CALL = re.compile(r"to=functions\.([^\s<]+)")
_HARMONY_END = re.compile(r"<\|call\|>|<\|end\|>|<\|return\|>|<\|start\|>")


@register_parser("harmony", markers=("<|channel|>", "to=functions."))
class HarmonyParser:
    """gpt-oss (harmony) tool calls: a message whose header has ``to=functions.NAME`` (usually on
    the ``commentary`` channel, ``<|constrain|>json``); its body after ``<|message|>`` up to
    ``<|call|>`` (or the end) is the JSON arguments. Analysis and final messages are not calls."""

    def parse(self, text: str, tools: ToolSchemas = NO_TOOLS) -> tuple[ToolCall, ...]:
        text = str(text)
        calls: list[ToolCall] = []
        for match in _HARMONY_CALL.finditer(text):
            body_at = text.find("<|message|>", match.end())
            if body_at < 0:
                calls.append(
                    ToolCall(
                        name=match[1],
                        id=f"call_{len(calls)}",
                        raw=text[match.start() :],
                        parse_error="the call has no <|message|> with its arguments",
                    )
                )
                continue
            body_at += len("<|message|>")
            end = _HARMONY_END.search(text, body_at)
            stop = end.start() if end else len(text)
            calls.append(
                _args_call(match[1], text[body_at:stop], len(calls), text[match.start() : stop])
            )
        return tuple(calls)


_GLM_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


@register_parser("glm45", markers=("<tool_call>", "<arg_key>"))
class Glm45Parser:
    """GLM-4.5 tool calls: ``<tool_call>NAME`` then ``<arg_key>k</arg_key><arg_value>v</arg_value>``
    pairs, then ``</tool_call>``. A ``<tool_call>`` whose body starts with ``{`` is read as
    hermes-style JSON (GLM-4 writes that too)."""

    def parse(self, text: str, tools: ToolSchemas = NO_TOOLS) -> tuple[ToolCall, ...]:
        calls: list[ToolCall] = []
        for match in _GLM_CALL.finditer(str(text)):
            body, raw, i = match[1], match[0], len(calls)
            if not match[0].endswith("</tool_call>"):
                calls.append(
                    ToolCall(name="", id=f"call_{i}", raw=raw, parse_error="unclosed <tool_call>")
                )
                continue
            if body.lstrip().startswith("{"):
                calls.append(_args_call_obj(body, i, raw))
                continue
            name = body.split("<arg_key>", 1)[0].strip()
            args = tools.typed(name, {k.strip(): v for k, v in _GLM_ARG.findall(body)})
            calls.append(_call_from_object({"name": name, "arguments": args}, i, raw))
        return tuple(calls)


def _args_call_obj(body: str, index: int, raw: str) -> ToolCall:
    try:
        return _call_from_object(json.loads(body), index, raw)
    except (ValueError, RecursionError) as e:
        reason = getattr(e, "msg", type(e).__name__)
        return ToolCall(
            name="", id=f"call_{index}", raw=raw, parse_error=f"invalid JSON ({reason})"
        )


# <tool_call> may be missing around a call (vLLM reads such a call too); a call is never dropped
_QC_CALL = re.compile(
    r"(<tool_call>\s*)?<function=([^>\n]+)>(.*?)</function>(?(1)\s*</tool_call>)", re.S
)
_QC_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


@register_parser("qwen3_coder", markers=("<tool_call>", "<function=", "<parameter="))
class Qwen3CoderParser:
    """Qwen3-Coder XML tool calls: ``<tool_call><function=NAME><parameter=k>v</parameter>…
    </function></tool_call>``; one newline around each value is part of the markup. A
    ``<tool_call>`` or ``<function=`` that does not read as a whole call is an error call."""

    def parse(self, text: str, tools: ToolSchemas = NO_TOOLS) -> tuple[ToolCall, ...]:
        text = str(text)
        calls: list[ToolCall] = []
        wrapped = 0
        for match in _QC_CALL.finditer(text):
            name, wrapped = match[2].strip(), wrapped + bool(match[1])
            args = tools.typed(name, {k.strip(): v for k, v in _QC_PARAM.findall(match[3])})
            calls.append(_call_from_object({"name": name, "arguments": args}, len(calls), match[0]))
        unread = text.count("<tool_call>") > wrapped
        if unread or text.count("<function=") > len(calls):
            start = text.rfind("<tool_call>" if unread else "<function=")
            calls.append(
                ToolCall(
                    name="",
                    id=f"call_{len(calls)}",
                    raw=text[start:],
                    parse_error="a <tool_call> block is not <function=NAME>"
                    "<parameter=KEY>VALUE</parameter>…</function></tool_call>",
                )
            )
        return tuple(calls)


_DS_BEGIN, _DS_SEP, _DS_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
_DS_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.S)


@register_parser("deepseek_v3", markers=("tool▁call▁begin",))
class DeepSeekV3Parser:
    """DeepSeek tool calls between ``<｜tool▁call▁begin｜>`` and ``<｜tool▁call▁end｜>``:
    ``NAME<｜tool▁sep｜>{json}`` (V3.1) or ``function<｜tool▁sep｜>NAME\\n```json\\n{json}\\n```
    `` (V3, R1-0528)."""

    def parse(self, text: str, tools: ToolSchemas = NO_TOOLS) -> tuple[ToolCall, ...]:
        text = str(text)
        calls: list[ToolCall] = []
        pos = text.find(_DS_BEGIN)
        while pos >= 0:
            start = pos + len(_DS_BEGIN)
            end = text.find(_DS_END, start)
            body = text[start : end if end >= 0 else len(text)]
            raw = text[pos : end + len(_DS_END) if end >= 0 else len(text)]
            i = len(calls)
            if end < 0 or _DS_SEP not in body:
                problem = "no <｜tool▁call▁end｜>" if end < 0 else "no <｜tool▁sep｜>"
                calls.append(
                    ToolCall(
                        name="", id=f"call_{i}", raw=raw, parse_error=f"malformed call: {problem}"
                    )
                )
            else:
                kind, rest = body.split(_DS_SEP, 1)
                if kind.strip() == "function" and "\n" in rest:  # V3: NAME\n```json ... ```
                    name, args_text = rest.split("\n", 1)
                    fence = _DS_FENCE.match(args_text)
                    calls.append(_args_call(name.strip(), fence[1] if fence else args_text, i, raw))
                else:
                    calls.append(_args_call(kind.strip(), rest, i, raw))
            pos = text.find(_DS_BEGIN, end) if end >= 0 else -1
        return tuple(calls)


def resolve_parser(requested: str, chat_template: str, *, has_tools: bool) -> str:
    """The parser to use: ``requested`` unless it is ``"auto"``; then the one the template's
    format implies. An unrecognised template with tools is an error naming the parsers (a
    silent default would leave every call unparsed: training without a single tool run)."""
    if requested != "auto":
        return requested
    found = detect_parser(chat_template)
    if found is not None:
        return found
    if not has_tools:
        return "hermes"  # no tools to call: the parser never matters
    raise ToolError(
        "rollout.parser=auto cannot tell the tool-call format of this chat template (none of "
        "the markers of a known family). Set rollout.parser to one of: "
        f"{', '.join(available_parsers())} (or register one with @register_parser)"
    )
