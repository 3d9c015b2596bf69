"""SFT data: JSONL conversations with tool calls, schema-checked, tokenized like the rollout loop.

A row is ``{"messages": [...], "tools": [...]?}`` with OpenAI-style messages: ``system`` /
``user`` / ``assistant`` / ``tool``; an assistant message may carry ``tool_calls``
(``[{"function": {"name", "arguments"}}]``, arguments an object or a JSON string). Other keys are
kept as metadata and ignored. A ``user`` or ``tool`` message's content may be a list of text and
image parts, for a vision-language model (:mod:`agentloop.trainers.sft_images`).

Tokenization goes through the rollout's :class:`~agentloop.chat.TokenBuilder`, turn by turn, so
the ids are exactly those a rollout of the same conversation produces: the prompt with the
generation prompt, each assistant turn encoded from the text the model writes plus its stop token
(``loss_mask`` 1), each observation as the builder's token-level suffix (``loss_mask`` 0).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agentloop.chat import TokenBuilder
from agentloop.errors import ConfigError, TemplateError
from agentloop.trainers.packing import TrainSeq
from agentloop.trainers.sft_images import content_parts, load_image
from agentloop.types import Message, ToolCall

if TYPE_CHECKING:
    from agentloop.vision import VisionProcessor

__all__ = [
    "Conversation",
    "SFTTokenizer",
    "assistant_text",
    "holdout_split",
    "load_conversations",
    "parse_row",
]

_ROLES = ("system", "user", "assistant", "tool")
_PROBE_HEAD = ({"role": "system", "content": "probe system"}, {"role": "user", "content": "probe"})
_SENTINEL = "AGENTLOOP_SFT_SENTINEL_51d2"


@dataclass(frozen=True)
class Conversation:
    """One checked row: its messages, the tool schemas its prompt shows, where it came from."""

    messages: tuple[Message, ...]
    tools: tuple[Mapping[str, Any], ...] | None
    source: str

    @property
    def num_assistant_turns(self) -> int:
        return sum(m.role == "assistant" for m in self.messages)


def _bad(where: str, field: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"{where}: {field}: {problem}; {fix}")


def _tool_calls(raw: Any, where: str, field: str) -> tuple[ToolCall, ...]:
    if not isinstance(raw, list):
        raise _bad(where, field, f"is a {type(raw).__name__}", "give a list of tool calls")
    calls = []
    for j, call in enumerate(raw):
        at = f"{field}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(
                where,
                f"{at}.function.name",
                "is missing or not a non-empty string",
                'write calls as {"function": {"name": "...", "arguments": {...}}}',
            )
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as exc:
                raise _bad(
                    where,
                    f"{at}.function.arguments",
                    f"is not valid JSON ({exc})",
                    "give a JSON object (or a string holding one)",
                ) from exc
        if not isinstance(args, dict):
            raise _bad(
                where,
                f"{at}.function.arguments",
                f"is a JSON {type(args).__name__}",
                'give an object such as {"code": "print(1)"}',
            )
        calls.append(ToolCall(name=fn["name"], arguments=args, id=str(call.get("id") or "")))
    return tuple(calls)


def _message(raw: Any, where: str, field: str, root: Path | None = None) -> Message:
    if not isinstance(raw, dict):
        raise _bad(where, field, f"is a {type(raw).__name__}", "give a message object")
    role = raw.get("role")
    if role not in _ROLES:
        raise _bad(where, f"{field}.role", f"is {role!r}", f"use one of {_ROLES}")
    content = raw.get("content")
    calls = (
        _tool_calls(raw["tool_calls"], where, f"{field}.tool_calls")
        if raw.get("tool_calls")
        else ()
    )
    if calls and role != "assistant":
        raise _bad(
            where,
            f"{field}.tool_calls",
            f"on a {role!r} message",
            "only assistant messages make tool calls",
        )
    if content is None and calls:
        content = ""
    images: tuple[str, ...] = ()
    if isinstance(content, list) and role in ("user", "tool"):
        content, images = content_parts(content, where, f"{field}.content", root)
    if not isinstance(content, str):
        raise _bad(
            where,
            f"{field}.content",
            f"is {type(content).__name__}",
            "give a string (null only for an assistant message with tool_calls; a list of "
            "text and image parts in a user or tool message)",
        )
    name, call_id = raw.get("name"), raw.get("tool_call_id")
    return Message(role, content, calls, tool_call_id=call_id, name=name, images=images)


def _check_order(messages: Sequence[Message], where: str) -> None:
    roles = [m.role for m in messages]
    if "assistant" not in roles:
        raise _bad(where, "messages", "has no assistant message", "add the replies to train on")
    first = roles.index("assistant")
    if "user" not in roles[:first]:
        raise _bad(
            where,
            f"messages[{first}]",
            "is an assistant message before any user message",
            "start the conversation with a user message (after an optional system one)",
        )
    if roles[-1] != "assistant":
        raise _bad(
            where,
            f"messages[{len(roles) - 1}]",
            f"is a {roles[-1]!r} message",
            "end the conversation with the assistant's reply",
        )
    for i in range(first + 1, len(roles)):
        if roles[i] == roles[i - 1] == "assistant":
            raise _bad(
                where,
                f"messages[{i}]",
                "follows another assistant message",
                "merge the two replies, or put the observation (tool/user) between them",
            )


def parse_row(row: Any, where: str, root: Path | None = None) -> Conversation:
    """Check one row and return its :class:`Conversation`; errors name ``where`` (file:line),
    the field (``messages[3].tool_calls[0].function.arguments``), the problem and the fix.
    Image file paths are relative to ``root`` (the JSONL file's folder)."""
    if not isinstance(row, dict):
        raise _bad(
            where,
            "row",
            f"is a JSON {type(row).__name__}",
            'each line must be an object {"messages": [...]}',
        )
    raw = row.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad(
            where,
            "messages",
            "is missing or empty",
            'give a non-empty list of {"role", "content"} messages',
        )
    messages = tuple(_message(m, where, f"messages[{i}]", root) for i, m in enumerate(raw))
    _check_order(messages, where)
    tools = row.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise _bad(
            where,
            "tools",
            "is not a list of objects",
            "give OpenAI function schemas, or leave the key out",
        )
    return Conversation(messages, tuple(tools) if tools else None, where)


def load_conversations(path: str | os.PathLike[str]) -> list[Conversation]:
    """Read and check every row of a JSONL file (blank lines skipped); the first bad row raises
    :class:`ConfigError` with its line number."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"SFT data file {str(p)!r} does not exist; pass a JSONL file")
    out = []
    with p.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{p}:{number}"
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise _bad(
                    where, "row", f"is not valid JSON ({exc})", "fix or remove the line"
                ) from exc
            out.append(parse_row(row, where, p.parent))
    if not out:
        raise ConfigError(f"SFT data file {str(p)!r} holds no rows")
    return out


def holdout_split(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """``(train, held_out)`` indices: a seeded shuffle, ``round(fraction·n)`` held out (at least
    one when ``fraction > 0``); both lists sorted."""
    order = list(range(n))
    random.Random(f"sft-holdout/{seed}").shuffle(order)
    k = max(1, round(fraction * n)) if fraction > 0 else 0
    if k >= n:
        raise ConfigError(f"eval_fraction={fraction} holds out all {n} rows; use a smaller one")
    return sorted(order[k:]), sorted(order[:k])


def _render(builder: TokenBuilder, dicts: Sequence[Mapping[str, Any]], gen: bool) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        rendered, _ = render_jinja_template(  # type: ignore[str-unpack]
            conversations=[[dict(d) for d in dicts]],
            chat_template=builder.chat_template,
            add_generation_prompt=gen,
            **builder.tokenizer.special_tokens_map,
        )
    except Exception as exc:
        raise TemplateError(f"chat template failed on an assistant tool-call turn: {exc}") from exc
    return str(rendered[0])


def _render_assistant(builder: TokenBuilder, content: str, calls: Sequence[ToolCall]) -> str:
    """The text between the generation prompt and the turn's closing, as the template writes
    an assistant message with ``calls``."""
    head = _render(builder, _PROBE_HEAD, gen=True)
    probe = _render(builder, [*_PROBE_HEAD, {"role": "assistant", "content": _SENTINEL}], False)
    close = probe[probe.index(_SENTINEL) + len(_SENTINEL) :]
    message = {"role": "assistant", "content": content, "tool_calls": [c.to_dict() for c in calls]}
    full = _render(builder, [*_PROBE_HEAD, message], gen=False)
    if not (full.startswith(head) and full.endswith(close)):
        raise TemplateError(
            "the chat template does not render an assistant turn with tool_calls as <generation "
            "prompt> + text + <closing>; put the calls into the content, as the model writes them"
        )
    return full[len(head) : len(full) - len(close)]


def assistant_text(builder: TokenBuilder, message: Message) -> str:
    """What the model writes for an assistant ``message``: its content, plus its tool calls in
    the chat template's own format. Content that already holds the rendered calls (agentloop's
    trajectory format) is taken as it is."""
    if not message.tool_calls:
        return message.content
    calls = _render_assistant(builder, "", message.tool_calls).strip()
    if not calls:
        raise TemplateError(
            "the chat template ignores assistant tool_calls; write the calls into the assistant "
            "content exactly as the model emits them"
        )
    if calls in message.content:
        return message.content
    return _render_assistant(builder, message.content, message.tool_calls)


class SFTTokenizer:
    """Conversations to :class:`TrainSeq` (``loss_mask`` 1 on assistant tokens), one
    :class:`TokenBuilder` per distinct tool list, all on ``tokenizer``'s chat template. With
    ``vision`` (a VLM's processor) the conversations' images expand to their placeholder runs
    and ride on each :class:`TrainSeq` as pixel inputs, as a rollout's do."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        default_tools: Sequence[Mapping[str, Any]] | None = None,
        vision: VisionProcessor | None = None,
    ):
        self.tokenizer = tokenizer
        self.default_tools = list(default_tools) if default_tools else None
        self.vision = vision
        self._builders: dict[str, TokenBuilder] = {}

    def builder(self, tools: Sequence[Mapping[str, Any]] | None) -> TokenBuilder:
        tools = list(tools) if tools else self.default_tools
        key = json.dumps(tools, sort_keys=True)
        if key not in self._builders:
            # an SFT conversation is one sequence: a template that drops earlier <think>
            # blocks trains on them kept (and logs that it does)
            self._builders[key] = TokenBuilder(
                self.tokenizer, tools=tools, thinking="keep", vision=self.vision
            )
        return self._builders[key]

    def model_messages(self, conv: Conversation) -> list[Message]:
        """``conv``'s messages with each assistant content replaced by :func:`assistant_text`:
        the conversation as a rollout records it (``TokenBuilder.check_text`` accepts it)."""
        builder = self.builder(conv.tools)
        if any(m.images for m in conv.messages) and self.vision is None:
            raise ConfigError(
                f"{conv.source}: the conversation has images but the model is a text model; "
                "train a vision-language model (Qwen2-VL family) on it, or drop the image parts"
            )
        return [
            Message("assistant", assistant_text(builder, m), m.tool_calls)
            if m.role == "assistant"
            else self._loaded(m, conv.source)
            for m in conv.messages
        ]

    @staticmethod
    def _loaded(m: Message, where: str) -> Message:
        if not m.images:
            return m
        images = tuple(load_image(i, where) if isinstance(i, str) else i for i in m.images)
        return Message(m.role, m.content, m.tool_calls, m.tool_call_id, m.name, images)

    def ids_and_mask(self, conv: Conversation) -> tuple[list[int], list[int]]:
        """Token ids and loss mask of ``conv``, built exactly as the rollout loop builds them."""
        return self._ids_mask_images(conv)[:2]

    def _ids_mask_images(self, conv: Conversation) -> tuple[list[int], list[int], list[Any]]:
        builder = self.builder(conv.tools)
        eos = builder.stop_token_ids[0]
        msgs = self.model_messages(conv)
        first = next(i for i, m in enumerate(msgs) if m.role == "assistant")
        ids = builder.prompt_ids(msgs[:first])
        mask = [0] * len(ids)
        i = first
        while i < len(msgs):
            completion = [*builder.encode(msgs[i].content), eos]
            ids += completion
            mask += [1] * len(completion)
            j = next((k for k in range(i + 1, len(msgs)) if msgs[k].role == "assistant"), len(msgs))
            if j > i + 1:
                obs = builder.observation_ids(msgs[i + 1 : j], completion)
                ids += obs
                mask += [0] * len(obs)
            i = j
        return ids, mask, [im for m in msgs for im in m.images]

    def train_seq(self, conv: Conversation) -> TrainSeq:
        """The conversation as a training sequence; its images (if any) as pixel inputs."""
        from agentloop.trainers.vlm import ImageInputs

        ids, mask, images = self._ids_mask_images(conv)
        m = torch.tensor(mask, dtype=torch.float32)
        zeros = torch.zeros(len(ids))
        pixels = None
        if images:
            assert self.vision is not None  # model_messages checked it
            p = self.vision.pixel_inputs(images)
            pixels = ImageInputs(p["pixel_values"].float(), p["image_grid_thw"].long())
        return TrainSeq(
            torch.tensor(ids, dtype=torch.long),
            m,
            advantages=m,
            rollout_logprobs=zeros,
            images=pixels,
        )
