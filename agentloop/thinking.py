"""Thinking-history policies (``rollout.thinking``) for chat templates that rewrite history.

Reasoning models' templates (Qwen3, DeepSeek-R1) drop earlier turns' ``<think>`` blocks, so an
episode is not one prefix-stable token sequence. :class:`~agentloop.chat.TokenBuilder` detects
such a template when it is made and calls :func:`require_policy`: ``auto`` rejects it, naming
the template and the policies that would work; ``keep`` and ``strip`` accept it (see
:class:`~agentloop.rollout.RolloutConfig`'s ``thinking``).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Literal

from agentloop.errors import ConfigError, TemplateError

__all__ = ["THINKING_POLICIES", "Thinking", "check_thinking", "require_policy", "template_label"]

log = logging.getLogger(__name__)
Thinking = Literal["auto", "keep", "strip"]
#: ``rollout.thinking`` values: ``auto`` (a template must be prefix-stable), ``keep``, ``strip``.
THINKING_POLICIES: tuple[Thinking, ...] = ("auto", "keep", "strip")
_LOGGED: set[tuple[str, str]] = set()


def check_thinking(value: str) -> None:
    """A ``ConfigError`` naming ``value`` unless it is one of :data:`THINKING_POLICIES`."""
    if value not in THINKING_POLICIES:
        raise ConfigError(
            f"rollout.thinking={value!r} is not a thinking-history policy; use one of "
            f"{', '.join(THINKING_POLICIES)}"
        )


def template_label(tokenizer: Any, template: str) -> str:
    """Names a chat template in errors: its model family, or its first line and a short hash."""
    from agentloop.formats import FAMILIES

    digest = hashlib.sha256(template.encode()).hexdigest()[:12]
    name = next(
        (f"agentloop's {f.name}" for f in FAMILIES.values() if f.chat_template == template), None
    )
    first = template.strip().splitlines()[0] if template.strip() else ""
    path = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
    what = name or f"starting {first[:60]!r}"
    return f"the chat template of {path} ({what}, sha256 {digest})"


def require_policy(tokenizer: Any, template: str, rewrites: str, thinking: str) -> None:
    """Reject a template that rewrites history (``rewrites``: ``"thinking"`` or ``"history"``)
    unless policy ``thinking`` handles it, naming the template and the policies that would;
    log the policy once per template."""
    label = template_label(tokenizer, template)
    what = (
        "drops earlier turns' <think> blocks"
        if rewrites == "thinking"
        else "rewrites earlier turns when messages are appended"
    )
    if thinking == "auto" or (thinking == "keep" and rewrites != "thinking"):
        fixes = (
            "set rollout.thinking=keep (earlier reasoning stays in the prompt: one "
            "trajectory per episode) or rollout.thinking=strip (the template's own "
            "rendering each turn: one training sample per turn); agentloop eval: "
            "--thinking keep|strip"
            if rewrites == "thinking"
            else "set rollout.thinking=strip (the template's own rendering each turn: one "
            "training sample per turn; agentloop eval: --thinking strip), or pass "
            "chat_template=... with a prefix-stable template (agentloop.formats has one per "
            "model family)"
        )
        raise TemplateError(
            f"{label} is not prefix-stable: it {what}, so an episode is not one token "
            f"sequence, which thinking={thinking!r} does not handle. To train with it, "
            f"{fixes}"
        )
    key = (label, thinking)
    if key not in _LOGGED:
        _LOGGED.add(key)
        how = (
            "earlier reasoning is kept in the prompt, unlike at inference"
            if thinking == "keep"
            else "each turn is rendered by the template and trained as its own sample"
        )
        log.info("%s %s; rollout.thinking=%s: %s", label, what, thinking, how)
