"""agentloop's harmony (gpt-oss) parser against ``openai_harmony``, the format's reference parser.

Generated gpt-oss replies (analysis and commentary preambles, one or several calls with the
recipient in either header position, unicode, nested objects, lookalike strings, final answers)
are parsed by agentloop and by ``openai_harmony`` (encoded with its o200k_harmony encoding,
then ``parse_messages_from_completion_tokens``); a call is a message to ``functions.NAME``. The
calls must agree: names, and arguments with their JSON types. Malformed replies keep what
harmony reads and make the rest error calls, as in ``test_vllm_parsers.py``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from test_vllm_parsers import SCHEMAS, TEXTS, _calls, _json_or_raw, _typed

from agentloop.testing.harmony_vocab import harmony_vocab_dir
from agentloop.tools import get_parser

harmony = pytest.importorskip("openai_harmony")

THOUGHTS = ("Need to search first.", "L'utilisateur veut 日本語.", "Check: 2 < 3 && 4 > 1 🎯")


def _call(rng: random.Random, name: str, args: dict[str, Any]) -> str:
    body = json.dumps(args, ensure_ascii=False)
    if rng.random() < 0.3:  # the recipient in the role part of the header, as harmony allows
        return (
            f" to=functions.{name}<|channel|>commentary <|constrain|>json<|message|>{body}<|call|>"
        )
    return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{body}<|call|>"


def harmony_replies(n: int = 34) -> Iterator[str]:
    """gpt-oss completions (what follows the prompt's ``<|start|>assistant``)."""
    rng = random.Random("harmony-41")
    for _ in range(n):
        parts = []
        if rng.random() < 0.6:
            parts.append(f"<|channel|>analysis<|message|>{rng.choice(THOUGHTS)}<|end|>")
        if rng.random() < 0.3:  # a preamble to the user before the calls
            parts.append(f"<|channel|>commentary<|message|>{rng.choice(TEXTS)}<|end|>")
        parts.extend(_call(rng, name, args) for name, args in _calls(rng))
        yield "<|start|>assistant".join(parts)
    yield "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>4"


MALFORMED = (
    '<|channel|>commentary to=functions.search <|constrain|>json<|message|>{"query": "cut',
    "<|channel|>commentary to=functions.search <|constrain|>json<|message|>{oops}<|call|>",
    '<|channel|>commentary to=functions.search <|constrain|>json<|message|>{"query": "a"}'
    "<|call|><|start|>assistant<|channel|>commentary to=functions.tag <|constrain|>json"
    '<|message|>{"labels": [<|call|>',
)


@pytest.fixture(scope="module")
def encoding() -> Iterator[Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_ENCODINGS_BASE", str(harmony_vocab_dir()))
        yield harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)


def reference(encoding: Any, text: str) -> list[tuple[str, str]]:
    """The calls ``openai_harmony`` reads: messages whose recipient is ``functions.NAME``."""
    tokens = encoding.encode(text, allowed_special="all")
    try:
        messages = encoding.parse_messages_from_completion_tokens(tokens, harmony.Role.ASSISTANT)
    except harmony.HarmonyError:
        return []  # harmony gives up on the whole reply
    return [
        (m.recipient.removeprefix("functions."), _json_or_raw(m.content[0].text))
        for m in messages
        if m.recipient and m.recipient.startswith("functions.")
    ]


def test_harmony_replies_parse_as_openai_harmony_parses_them(encoding: Any) -> None:
    replies = list(harmony_replies())
    assert len({*replies}) >= 30
    parser = get_parser("harmony")
    for text in replies:
        calls = parser.parse(text, SCHEMAS)
        assert all(c.parse_error is None for c in calls), (text, calls)
        assert [(c.name, _typed(dict(c.arguments))) for c in calls] == reference(encoding, text)
    assert not reference(encoding, replies[-1])  # the final answer: no calls on either side


def test_malformed_harmony_keeps_what_harmony_reads_and_flags_the_rest(encoding: Any) -> None:
    parser = get_parser("harmony")
    for text in MALFORMED:
        calls = parser.parse(text, SCHEMAS)
        theirs = reference(encoding, text)
        good = [(c.name, _typed(dict(c.arguments))) for c in calls if c.parse_error is None]
        errors = [c for c in calls if c.parse_error is not None]
        assert errors, (text, calls)
        assert not theirs or all(call in theirs for call in good), (text, good, theirs)
        assert len([c for c in theirs if c not in good]) <= len(errors), (text, theirs, calls)
