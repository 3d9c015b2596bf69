"""SegmentEncoder: piecewise, cached encoding gives exactly the tokenizer's own ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop.chat import TokenBuilder
from agentloop.segments import SegmentEncoder
from agentloop.types import Message

ADDED = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"]
ADDED += ["<tool_response>", "</tool_response>", "<tool", "<|im_"]  # near misses too
PIECES = st.one_of(
    st.sampled_from(ADDED),
    st.sampled_from(["\n", "\n\n", " ", "  ", "\t", "\r\n", "user\n", "assistant\n", "1234"]),
    st.sampled_from(["e\u0301", "\u0301", "é", "数学", "🙂", "\ufffd", "'s", "’ll"]),  # NFC, bytes
    st.text(max_size=12),
)


def reference(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)


@settings(max_examples=400, deadline=None)
@given(st.lists(PIECES, max_size=24))
def test_piecewise_ids_equal_the_tokenizers(tokenizer: Any, pieces: list[str]) -> None:
    encoder = SegmentEncoder.for_tokenizer(tokenizer)
    assert encoder is not None
    text = "".join(pieces)
    assert encoder.encode(text) == reference(tokenizer, text)
    assert encoder.encode(text) == reference(tokenizer, text)  # again, from the cache


def test_builder_prompts_and_observations_are_unchanged(tokenizer: Any) -> None:
    tools = [{"type": "function", "function": {"name": "f", "description": "d" * 3000}}]
    builder = TokenBuilder(tokenizer, tools=tools)
    assert builder._segments is not None
    for i in range(3):
        messages = [Message("system", "Be brief."), Message("user", f"What is {i} + {i}?")]
        text = builder.render(messages, add_generation_prompt=True)
        assert builder.prompt_ids(messages) == reference(tokenizer, text)
    obs = [Message("tool", " 42 \n", tool_call_id="c", name="f")]
    text = builder._assistant_close + builder._suffix(obs)
    assert builder.observation_ids(obs, []) == reference(tokenizer, text)


def test_tokenizers_with_stripping_added_tokens_encode_whole_texts(tiny_model_dir: Path) -> None:
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.add_tokens([AddedToken("<mark>", lstrip=True)])
    assert SegmentEncoder.for_tokenizer(tok) is None  # " <mark>" would eat its space
    builder = TokenBuilder(tok)
    text = "a <mark> b<|im_end|>"
    assert builder.encode(text) == reference(tok, text)
