"""The chat template's side of a proxied request: render, size, encode, compare (no state)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentloop.chat import TokenBuilder
from agentloop.errors import TemplateError
from agentloop.proxy.errors import ProxyRequestError
from agentloop.proxy.openai_api import AssistantKey
from agentloop.types import Message

__all__ = ["encoded", "markup", "observation_text", "rendered", "renders_as", "tools_key"]


def renders_as(builder: TokenBuilder, ids: Sequence[int], messages: Sequence[Message]) -> bool:
    """Whether ``ids`` spell exactly the template's rendering of ``messages`` (plus the
    generation prompt). A template that fails to render is a no here: the fresh render of the
    new segment then names the error."""
    try:
        expected = builder.render(messages, add_generation_prompt=True)
    except TemplateError:
        return False
    got = builder.tokenizer.decode(
        list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    return bool(got == expected)


def tools_key(tools: Sequence[Mapping[str, Any]]) -> str:
    """A short key of a tool list (segments compare it; a digest keeps no copy of big tools)."""
    return hashlib.sha256(json.dumps(list(tools), sort_keys=True).encode()).hexdigest()


def rendered(builder: TokenBuilder, messages: Sequence[Message]) -> str:
    try:
        return builder.prompt_text(messages)
    except (TemplateError, RecursionError) as exc:
        raise ProxyRequestError(
            f"the chat template cannot render these messages: {exc}", param="messages"
        ) from exc


def encoded(builder: TokenBuilder, text: str, messages: Sequence[Message]) -> list[int]:
    try:
        return builder.encode_text(text, messages)
    except TemplateError as exc:
        raise ProxyRequestError(f"{exc}", param="messages") from exc


def observation_text(builder: TokenBuilder, new: Sequence[Message], sampled: Sequence[int]) -> str:
    try:
        return builder.observation_text(new, sampled)
    except (TemplateError, RecursionError) as exc:
        raise ProxyRequestError(
            f"the chat template cannot render the new messages: {exc}", param="messages"
        ) from exc


def markup(key: AssistantKey, index: int) -> str:
    """An assistant message the model did not write, in the Hermes/Qwen call markup."""
    content, calls = key
    blocks = [
        f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {args}}}\n</tool_call>'
        for _, name, args in calls
    ]
    return "\n".join([content, *blocks] if content else blocks)
