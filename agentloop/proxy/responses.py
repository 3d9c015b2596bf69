"""The proxy's Responses API: ``/v1/responses`` requests read as chat; responses and events.

A request's input items become the chat conversation the proxy already assembles token-exactly
(:meth:`~agentloop.proxy.episode.Episode.prepare_chat`): ``instructions`` and ``system`` /
``developer`` messages are system messages, ``function_call`` items join the assistant turn
before them as its tool calls, ``function_call_output`` items are tool messages, and Responses
function tools (``{"type": "function", "name", "parameters"}``) are the chat template's tools. A
``previous_response_id`` continues a response of the same episode: its conversation (input and
output, not its instructions) comes before the new input, as OpenAI chains them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agentloop.proxy.openai_api import AssistantKey, ProxyRequestError, assistant_key
from agentloop.types import Message, ToolCall

__all__ = [
    "Items",
    "ResponsesRequest",
    "conversation",
    "new_response_id",
    "output_items",
    "parse_responses_request",
    "response_events",
    "response_object",
    "with_instructions",
    "write_events",
]

#: The conversation a response leaves behind: its input items and its output, chat-shaped.
Items = tuple[Message | AssistantKey, ...]
_ROLES = {"system": "system", "developer": "system", "user": "user"}
#: Fields that ask for something the proxy cannot do; refused rather than silently ignored.
_REFUSED = {
    "background": "background responses are not supported: send the request and wait",
    "conversation": "conversations are not stored here: send the input, or previous_response_id",
    "prompt": "stored prompt templates are not supported: send instructions and input",
}


@dataclass(frozen=True)
class ResponsesRequest:
    """A ``/v1/responses`` request, checked. ``tools`` are in the chat form the template
    renders (none when ``tool_choice`` is ``"none"``); ``wire_tools`` as the client sent them."""

    model: str
    items: Items
    instructions: str | None
    tools: tuple[Mapping[str, Any], ...]
    wire_tools: tuple[Mapping[str, Any], ...]
    tool_choice: str | Mapping[str, Any]
    previous_response_id: str | None
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    parallel_tool_calls: bool
    stream: bool


def _bad(message: str, param: str) -> ProxyRequestError:
    return ProxyRequestError(message, param=param)


def parse_responses_request(body: Any) -> ResponsesRequest:
    """Check a Responses request; errors name the offending field (``input[2].call_id``)."""
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {type(body).__name__}", "body")
    if not isinstance(body.get("model"), str):
        raise _bad("'model' is required: a model name from GET /v1/models", "model")
    for name, why in _REFUSED.items():
        if body.get(name):
            raise _bad(f"{name}: {why}", name)
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise _bad(f"max_output_tokens must be an integer >= 1, got {max_tokens!r}",
                   "max_output_tokens")  # fmt: skip
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _bad(f"{name} must be a number, got {value!r}", name)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("instructions must be a string", "instructions")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise _bad("previous_response_id must be a string (a response id)", "previous_response_id")
    wire_tools = _wire_tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice", "auto"), wire_tools)
    tools = () if choice == "none" else tuple(_chat_tool(t) for t in wire_tools)
    return ResponsesRequest(
        model=body["model"],
        items=_items(body.get("input")),
        instructions=instructions or None,
        tools=tools,
        wire_tools=wire_tools,
        tool_choice=choice,
        previous_response_id=previous,
        max_tokens=max_tokens,
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        stream=bool(body.get("stream")),
    )


def _wire_tools(tools: Any) -> tuple[Mapping[str, Any], ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise _bad("'tools' must be a list of {type: function, name, parameters}", "tools")
    for i, t in enumerate(tools):
        kind = t.get("type") if isinstance(t, dict) else type(t).__name__
        if kind != "function":
            raise _bad(f"tools[{i}] is a {kind!r} tool; only function tools are supported "
                       "(the agent runs its tools itself)", f"tools[{i}].type")  # fmt: skip
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise _bad(f"tools[{i}] needs a 'name'", f"tools[{i}].name")
        if t.get("parameters") is not None and not isinstance(t["parameters"], dict):
            raise _bad(f"tools[{i}].parameters must be a JSON schema object",
                       f"tools[{i}].parameters")  # fmt: skip
    return tuple(tools)


def _chat_tool(t: Mapping[str, Any]) -> dict[str, Any]:
    """The chat form of a Responses function tool, keys in the chat API's order (templates
    render the tool's JSON as given)."""
    function: dict[str, Any] = {"name": t["name"]}
    if t.get("description") is not None:
        function["description"] = t["description"]
    if t.get("parameters") is not None:
        function["parameters"] = t["parameters"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, tools: Sequence[Mapping[str, Any]]) -> str | Mapping[str, Any]:
    if choice in ("auto", "required", "none"):
        return str(choice)
    names = [t["name"] for t in tools]
    if isinstance(choice, dict) and choice.get("type") == "function":
        if choice.get("name") not in names:
            raise _bad(f"tool_choice names function {choice.get('name')!r}, which is not among "
                       f"the tools {names}", "tool_choice.name")  # fmt: skip
        return choice
    raise _bad(f"tool_choice must be 'auto', 'required', 'none' or {{type: function, name}}, "
               f"got {choice!r:.80}", "tool_choice")  # fmt: skip


# ------------------------------------------------------------------------- input items
def _items(input_: Any) -> Items:
    """Input items as chat messages; a ``function_call`` joins the assistant turn before it."""
    if isinstance(input_, str):
        if not input_:
            raise _bad("'input' is an empty string", "input")
        return (Message("user", input_),)
    if not isinstance(input_, list) or not input_:
        raise _bad("'input' must be a string or a non-empty list of input items", "input")
    out: list[Message | AssistantKey] = []
    pending: tuple[str, list[dict[str, Any]]] | None = None  # the assistant turn being built
    for i, item in enumerate(input_):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"{where} must be an object (a message or a function call item)", where)
        kind = item.get("type", "message")
        if kind == "function_call":
            call = _function_call(item, where)
            pending = ("", [call]) if pending is None else (pending[0], [*pending[1], call])
            continue
        if pending is not None:
            out.append(assistant_key(pending[0], pending[1], where))
            pending = None
        if kind == "message" and item.get("role") == "assistant":
            pending = (_content(item.get("content"), where, "output_text"), [])
        elif kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call_output":
            out.append(_function_output(item, where))
        else:
            raise _bad(f"{where} is a {kind!r} item; supported: message, function_call, "
                       "function_call_output", f"{where}.type")  # fmt: skip
    if pending is not None:
        out.append(assistant_key(pending[0], pending[1], f"input[{len(input_) - 1}]"))
    return tuple(out)


def _message(item: Mapping[str, Any], where: str) -> Message:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise _bad(f"{where}.role {role!r} is not one of user, system, developer, assistant",
                   f"{where}.role")  # fmt: skip
    return Message(_ROLES[role], _content(item.get("content"), where, "input_text"))  # type: ignore[arg-type]


def _content(content: Any, where: str, part_type: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or a list of {part_type} parts",
                   f"{where}.content")  # fmt: skip
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind not in ("input_text", "output_text") or not isinstance(part.get("text"), str):
            raise _bad(f"{where}.content[{j}] is a {kind!r} part; only text parts "
                       f"({part_type}) are supported", f"{where}.content[{j}]")  # fmt: skip
        texts.append(part["text"])
    return "".join(texts)


def _function_call(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    for name in ("call_id", "name", "arguments"):
        if not isinstance(item.get(name), str):
            raise _bad(f"{where} (function_call) needs '{name}' as a string", f"{where}.{name}")
    return {"id": item["call_id"], "function": {"name": item["name"],
                                                "arguments": item["arguments"]}}  # fmt: skip


def _function_output(item: Mapping[str, Any], where: str) -> Message:
    if not isinstance(item.get("call_id"), str):
        raise _bad(f"{where} (function_call_output) needs 'call_id'", f"{where}.call_id")
    output = item.get("output")
    text = output if isinstance(output, str) else _content(output, f"{where}.output", "input_text")
    return Message("tool", text, tool_call_id=item["call_id"])


def conversation(req: ResponsesRequest, chains: Mapping[str, Items]) -> Items:
    """The conversation without instructions: the chained response's, then the new input."""
    if req.previous_response_id is None:
        return req.items
    earlier = chains.get(req.previous_response_id)
    if earlier is None:
        raise ProxyRequestError(
            f"previous response {req.previous_response_id[:60]!r} not found in this episode: "
            "chain only responses this episode returned",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return earlier + req.items


def with_instructions(req: ResponsesRequest, items: Items) -> Items:
    """What the model sees: ``instructions`` as the first system message, then ``items``."""
    return ((Message("system", req.instructions),) if req.instructions else ()) + items


# ------------------------------------------------------------------------- output
def _output(rid: str, content: str, calls: Sequence[ToolCall], status: str) -> list[Any]:
    out: list[dict[str, Any]] = []
    if content or not calls:
        text = {"type": "output_text", "text": content, "annotations": [], "logprobs": []}
        out.append({"id": f"msg_{rid[5:]}", "type": "message", "role": "assistant",
                    "status": status, "content": [text]})  # fmt: skip
    for k, c in enumerate(calls):
        out.append({"id": f"fc_{rid[5:]}_{k}", "type": "function_call", "call_id": c.id,
                    "name": c.name, "arguments": json.dumps(dict(c.arguments)),
                    "status": "completed"})  # fmt: skip
    return out


def new_response_id() -> str:
    """A fresh response id (``resp_<hex>``)."""
    return f"resp_{uuid.uuid4().hex}"


def response_object(
    rid: str,
    req: ResponsesRequest,
    reply: tuple[str, Sequence[ToolCall], str],
    usage: tuple[int, int],
) -> dict[str, Any]:
    """A ``response`` object for ``reply`` (visible content, tool calls, finish reason)."""
    content, calls, finish = reply
    status = "incomplete" if finish == "length" else "completed"
    now = time.time()
    return {
        "id": rid,
        "object": "response",
        "created_at": now,
        "completed_at": now,
        "status": status,
        "model": req.model,
        "output": _output(rid, content, calls, status),
        "instructions": req.instructions,
        "previous_response_id": req.previous_response_id,
        "tools": list(req.wire_tools),
        "tool_choice": req.tool_choice,
        "parallel_tool_calls": req.parallel_tool_calls,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "max_output_tokens": req.max_tokens,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status != "completed" else None,
        "metadata": {},
        "usage": {
            "input_tokens": usage[0],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage[1],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": sum(usage),
        },
    }


def output_items(response: Mapping[str, Any]) -> Items:
    """The conversation items a response adds (its output, as the agent sends it back)."""
    content, calls = "", []
    for item in response["output"]:
        if item["type"] == "message":
            content = item["content"][0]["text"]
        else:
            function = {"name": item["name"], "arguments": item["arguments"]}
            calls.append({"id": item["call_id"], "function": function})
    return (assistant_key(content, calls),)


def response_events(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The streamed events of one finished response, in order, as OpenAI sends them."""
    started = {**response, "status": "in_progress", "output": [], "usage": None,
               "completed_at": None, "incomplete_details": None}  # fmt: skip
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    for k, item in enumerate(response["output"]):
        at = {"output_index": k, "item_id": item["id"]}
        if item["type"] == "message":
            part = item["content"][0]
            opened = {**item, "status": "in_progress", "content": []}
            empty = {**part, "text": ""}
            events += [
                {"type": "response.output_item.added", "output_index": k, "item": opened},
                {"type": "response.content_part.added", **at, "content_index": 0, "part": empty},
                {"type": "response.output_text.delta", **at, "content_index": 0,
                 "delta": part["text"], "logprobs": []},
                {"type": "response.output_text.done", **at, "content_index": 0,
                 "text": part["text"], "logprobs": []},
                {"type": "response.content_part.done", **at, "content_index": 0, "part": part},
            ]  # fmt: skip
        else:
            opened = {**item, "status": "in_progress", "arguments": ""}
            events += [
                {"type": "response.output_item.added", "output_index": k, "item": opened},
                {"type": "response.function_call_arguments.delta", **at,
                 "delta": item["arguments"]},
                {"type": "response.function_call_arguments.done", **at,
                 "arguments": item["arguments"]},
            ]  # fmt: skip
        events.append({"type": "response.output_item.done", "output_index": k, "item": item})
    done = "response.completed" if response["status"] == "completed" else "response.incomplete"
    events.append({"type": done, "response": response})
    return [{**e, "sequence_number": n} for n, e in enumerate(events)]


async def write_events(
    request: web.Request, events: Sequence[dict[str, Any]]
) -> web.StreamResponse:
    """Server-sent events, each ``event: <type>`` with its JSON ``data:``; the stream ends
    with the terminal event (no ``[DONE]``, as OpenAI's Responses streams)."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for event in events:
        await response.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
    await response.write_eof()
    return response
