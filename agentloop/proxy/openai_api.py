"""OpenAI wire format for the proxy: read chat/completions requests, write responses and errors."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentloop.proxy.errors import ProxyRequestError, error_body
from agentloop.proxy.validate import check_tools, opt_bool, opt_int, opt_number, opt_str
from agentloop.types import Message, ToolCall

if TYPE_CHECKING:
    from aiohttp import web

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "ProxyRequestError",
    "assistant_key",
    "chat_response",
    "chat_stream_chunks",
    "completion_response",
    "completion_stream_chunks",
    "error_body",
    "parse_chat_request",
    "parse_completion_request",
    "sse_response",
]

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
#: An assistant message as the agent sends it back: (visible content, ((id, name, args json),...))
AssistantKey = tuple[str, tuple[tuple[str, str, str], ...]]


@dataclass(frozen=True)
class ChatRequest:
    """A ``/v1/chat/completions`` request, checked. Assistant messages keep the wire form
    (``key``) until the episode resolves them to the model's raw text."""

    model: str
    messages: tuple[Message | AssistantKey, ...]
    tools: tuple[Mapping[str, Any], ...]
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    stream: bool
    include_usage: bool


@dataclass(frozen=True)
class CompletionRequest:
    """A ``/v1/completions`` request: the prompt as text or token ids."""

    model: str
    prompt: str | tuple[int, ...]
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    stream: bool
    include_usage: bool


def _bad(message: str, param: str) -> ProxyRequestError:
    return ProxyRequestError(message, param=param)


def _common(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {type(body).__name__}", "body")
    if not isinstance(body.get("model"), str):
        raise _bad("'model' is required: a model name from GET /v1/models", "model")
    if opt_int(body, "n", 1) not in (None, 1):
        raise _bad(f"n={body['n']} is not supported: send one request per sample", "n")
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = opt_int(body, key, 1, param="max_tokens")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad(f"stream_options must be an object, got {options!r:.40}", "stream_options")
    return {
        "model": body["model"],
        "max_tokens": max_tokens,
        "temperature": opt_number(body, "temperature", 0.0, 2.0),
        "top_p": opt_number(body, "top_p", 1e-9, 1.0),
        "stream": opt_bool(body, "stream"),
        "include_usage": opt_bool(options or {}, "include_usage"),
    }


def parse_chat_request(body: Any) -> ChatRequest:
    """Check a chat request; errors name the offending field (``messages[2].tool_calls``)."""
    common = _common(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list of chat messages", "messages")
    tools = check_tools(body.get("tools"))
    parsed = tuple(_message(m, f"messages[{i}]") for i, m in enumerate(messages))
    return ChatRequest(messages=parsed, tools=tools, **common)


def parse_completion_request(body: Any) -> CompletionRequest:
    """Check a completions request: ``prompt`` is one string or one list of token ids (the
    ids' range is checked against the vocabulary by the episode)."""
    common = _common(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(t) is int and t >= 0 for t in prompt):
        return CompletionRequest(prompt=tuple(prompt), **common)
    if isinstance(prompt, str) and prompt:
        return CompletionRequest(prompt=prompt, **common)
    raise _bad("'prompt' must be a non-empty string or a list of token ids (one prompt)", "prompt")


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _bad(f"{where}.content[{j}] is a {kind!r:.40} part; only text parts", where)
            parts.append(opt_str(part, "text", f"{where}.content[{j}]") or "")
        return "".join(parts)
    raise _bad(f"{where}.content must be a string or a list of text parts", f"{where}.content")


def _message(m: Any, where: str) -> Message | AssistantKey:
    if not isinstance(m, dict):
        raise _bad(f"{where} must be an object with 'role' and 'content'", where)
    role = m.get("role")
    content = _text(m.get("content"), where)
    name = opt_str(m, "name", where)
    if role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str):
            raise _bad(f"{where} (role tool) needs 'tool_call_id'", f"{where}.tool_call_id")
        return Message("tool", content, tool_call_id=call_id, name=name)
    if role == "assistant":
        calls = m.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise _bad(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
        return assistant_key(content, calls or [], where)
    if not isinstance(role, str) or role not in _ROLES:
        raise _bad(
            f"{where}.role {role!r:.40} is not one of system, developer, user, assistant, tool",
            f"{where}.role",
        )
    return Message(_ROLES[role], content)  # type: ignore[arg-type]


def assistant_key(content: str, calls: Sequence[Any], where: str = "message") -> AssistantKey:
    """The comparable form of an assistant message: visible text and its calls, arguments
    normalized as sorted JSON (an agent may re-serialize them)."""
    out = []
    for j, c in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"{at} needs function.name and function.arguments", at)
        call_id = opt_str(c, "id", at) or ""
        args = fn.get("arguments") or "{}"
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except (ValueError, RecursionError) as exc:
            raise _bad(
                f"{at}.function.arguments is not JSON ({exc}); the chat template cannot render "
                f"this tool call: {args!r:.80}",
                f"{at}.function.arguments",
            ) from exc
        if not isinstance(parsed, dict):
            raise _bad(f"{at}.function.arguments must be a JSON object", at)
        out.append((call_id, fn["name"], json.dumps(parsed, sort_keys=True)))
    return content.strip(), tuple(out)


# ------------------------------------------------------------------------- responses
def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _wire_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))},
        }
        for c in calls
    ]


def _finish(finish: str, calls: Sequence[ToolCall]) -> str:
    return "tool_calls" if calls and finish == "stop" else finish


def chat_response(
    rid: str,
    model: str,
    content: str,
    calls: Sequence[ToolCall],
    finish: str,
    usage: tuple[int, int],
) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = _wire_calls(calls)
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish(finish, calls)}],
        "usage": _usage(*usage),
    }


def chat_stream_chunks(
    rid: str,
    model: str,
    content: str,
    calls: Sequence[ToolCall],
    finish: str,
    usage: tuple[int, int] | None,
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of one finished completion, in order."""
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        return {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }

    out = [chunk({"role": "assistant", "content": ""})]
    if content:
        out.append(chunk({"content": content}))
    for k, call in enumerate(_wire_calls(calls)):
        out.append(chunk({"tool_calls": [{"index": k, **call}]}))
    out.append(chunk({}, _finish(finish, calls)))
    if usage is not None:
        last = {**chunk({}), "choices": [], "usage": _usage(*usage)}
        out.append(last)
    return out


def completion_response(
    rid: str, model: str, text: str, finish: str, usage: tuple[int, int]
) -> dict[str, Any]:
    """A ``text_completion`` object."""
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
        "usage": _usage(*usage),
    }


def completion_stream_chunks(
    rid: str, model: str, text: str, finish: str, usage: tuple[int, int] | None
) -> list[dict[str, Any]]:
    """The streamed ``text_completion`` objects of one finished completion."""
    first = completion_response(rid, model, text, finish, (0, 0))
    del first["usage"]
    out = [first]
    if usage is not None:
        out.append({**first, "choices": [], "usage": _usage(*usage)})
    return out


async def sse_response(
    request: web.Request, chunks: Sequence[dict[str, Any]]
) -> web.StreamResponse:
    """Server-sent events: one ``data:`` line per chunk, then ``data: [DONE]``. The chunks are
    of a finished completion (the tool calls are parsed from the whole text), not
    token-by-token increments."""
    from aiohttp import web

    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for chunk in chunks:
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
