"""TokenBuilder: golden strings per template, ids match apply_chat_template, bad templates fail."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agentloop.chat import TokenBuilder
from agentloop.errors import TemplateError
from agentloop.types import Message

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run code.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
]
PROMPT = [Message("system", "Be exact."), Message("user", "What is 2+2?")]
CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(2+2)"}}\n</tool_call>'

LLAMA3 = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# Hides earlier assistant turns, like templates that strip reasoning from history.
NOT_PREFIX_STABLE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and not loop.last %}[hidden]{% else %}{{ m['content'] }}"
    "{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Inserts text before the assistant content that the model never sampled.
INSERTS_THINK = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}<think></think>{% endif %}{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def ids(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def test_prompt_ids_equal_apply_chat_template(tokenizer: Any) -> None:
    builder = TokenBuilder(tokenizer, tools=TOOLS)
    expected = tokenizer.apply_chat_template(
        [m.to_template_dict() for m in PROMPT], tools=TOOLS, add_generation_prompt=True,
        tokenize=True, return_dict=False,
    )  # fmt: skip
    assert builder.prompt_ids(PROMPT) == list(expected)


def test_tiny_template_golden_strings(tokenizer: Any) -> None:
    builder = TokenBuilder(tokenizer)
    prompt = tokenizer.decode(builder.prompt_ids(PROMPT))
    assert prompt == (
        "<|im_start|>system\nBe exact.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    sampled = [*ids(tokenizer, CALL), tokenizer.eos_token_id]  # Qwen stops at <|im_end|>
    obs = [Message("tool", "4", name="python"), Message("tool", "5", name="python")]
    assert tokenizer.decode(builder.observation_ids(obs, sampled)) == (
        "\n<|im_start|>user\n<tool_response>\n4\n</tool_response>\n<tool_response>\n5\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # A turn cut by the length limit did not sample the end token: the builder closes it.
    cut = ids(tokenizer, "<tool_call>\n{")
    assert tokenizer.decode(builder.observation_ids([Message("user", "go on")], cut)) == (
        "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"
    )


def test_llama3_style_template_golden_strings(tokenizer: Any) -> None:
    tok = copy.deepcopy(tokenizer)
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok.add_special_tokens({"additional_special_tokens": specials})
    tok.eos_token = "<|eot_id|>"
    tok.name_or_path = ""  # no generation config next to it
    builder = TokenBuilder(tok, chat_template=LLAMA3)
    assert builder.stop_token_ids == (tok.convert_tokens_to_ids("<|eot_id|>"),)
    sampled = [*ids(tok, "four"), tok.eos_token_id]
    obs = [Message("tool", "4")]
    assert tok.decode(builder.observation_ids(obs, sampled)) == (
        "<|start_header_id|>tool<|end_header_id|>\n\n4<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_non_prefix_stable_template_is_rejected(tokenizer: Any) -> None:
    with pytest.raises(TemplateError, match="not prefix-stable"):
        TokenBuilder(tokenizer, chat_template=NOT_PREFIX_STABLE)


def test_template_that_rewrites_assistant_turns_is_rejected(tokenizer: Any) -> None:
    with pytest.raises(TemplateError, match="generation prompt"):
        TokenBuilder(tokenizer, chat_template=INSERTS_THINK)


def test_missing_template_is_a_clear_error(tokenizer: Any) -> None:
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    with pytest.raises(TemplateError, match="no chat template"):
        TokenBuilder(tok)


def test_check_text_accepts_a_real_conversation_and_catches_drift(tokenizer: Any) -> None:
    builder = TokenBuilder(tokenizer, tools=TOOLS)
    prompt = builder.prompt_ids(PROMPT)
    sampled = [*ids(tokenizer, CALL), tokenizer.eos_token_id]
    obs = [Message("tool", "4", name="python")]
    obs_ids = builder.observation_ids(obs, sampled)
    answer = [*ids(tokenizer, "\\boxed{4}"), tokenizer.eos_token_id]
    messages = [
        *PROMPT, Message("assistant", builder.decode(sampled)), *obs,
        Message("assistant", builder.decode(answer)),
    ]  # fmt: skip
    builder.check_text(prompt + sampled + obs_ids + answer, messages)
    with pytest.raises(TemplateError, match="first difference"):
        builder.check_text(prompt + sampled + obs_ids[1:] + answer, messages)


TRIMS_CONTENT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("template", [None, LLAMA3, TRIMS_CONTENT])
def test_observation_suffix_matches_a_full_render(tokenizer: Any, template: str | None) -> None:
    """Learned template fragments (the fast path) must give exactly what rendering gives."""
    tok = tokenizer
    if template == LLAMA3:
        tok = copy.deepcopy(tokenizer)
        specials = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|begin_of_text|>"]
        tok.add_special_tokens({"additional_special_tokens": specials})
        tok.eos_token = "<|eot_id|>"
    builder = TokenBuilder(tok, chat_template=template)
    history = [*PROMPT, Message("assistant", "x")]
    for contents in (["4"], ["  padded \n", "second"], ["", "\n"], ["4"]):
        obs = [Message("tool", c, name="python") for c in contents]
        full = builder.render([*history, *obs], add_generation_prompt=True)
        expected = full[len(builder.render(history, add_generation_prompt=False)) :]
        assert builder._suffix(obs) == expected


# Leaves out messages with empty content: fragments learned on non-empty content must not be
# filled with an empty one.
SKIPS_EMPTY = (
    "{% for m in messages %}{% if m['content'] %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("template", [None, TRIMS_CONTENT, SKIPS_EMPTY])
def test_prompt_and_suffix_fast_paths_match_a_full_render(
    tokenizer: Any, template: str | None
) -> None:
    """Prompts and observations are filled into learned fragments: always the rendered text."""
    builder = TokenBuilder(tokenizer, tools=TOOLS, chat_template=template)
    prompts = [
        PROMPT,
        [Message("system", " Be\texact. "), Message("user", "What is 3+4?\n")],
        [Message("system", ""), Message("user", "What is 2+2?")],
        [Message("user", "")],
        [*PROMPT, Message("assistant", "Sure."), Message("user", "Go on.")],  # few-shot: renders
        PROMPT,
    ]
    for prompt in prompts:
        expected = builder.render(prompt, add_generation_prompt=True)
        assert tokenizer.decode(builder.prompt_ids(prompt)) == expected
        assert builder.prompt_ids(prompt) == ids(tokenizer, expected)
    history = [*PROMPT, Message("assistant", "x")]
    for contents in (["4"], [""], ["4", ""], ["", "4"], ["4"]):
        obs = [Message("tool", c, name="python") for c in contents]
        full = builder.render([*history, *obs], add_generation_prompt=True)
        assert (
            builder._suffix(obs)
            == full[len(builder.render(history, add_generation_prompt=False)) :]
        )
