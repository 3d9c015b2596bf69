"""Chat templates written for agentloop from each model family's documented format, and their table.

Each template renders the family's documented prompt layout: the tools in the system (or
developer) turn, the assistant turn, tool responses, and the generation prompt. Assistant
messages are rendered *as sampled* (``Message.content`` keeps the model's raw text, tool-call
markup and reasoning blocks included), so every template here is prefix-stable: appending
messages never changes the text of earlier turns, and trajectories are one token-exact sequence.

``prefix_stable_official`` says whether the family's *own* (Hugging Face) template is prefix-stable
too. Where it is not — it drops earlier reasoning, or moves the tool list — agentloop's
:class:`~agentloop.chat.TokenBuilder` rejects it at start-up unless ``rollout.thinking`` declares
a policy (``keep``, ``strip``); or pass ``chat_template=`` with the template here (it keeps
earlier reasoning in the prompt) to train such a model.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FAMILIES", "HERMES_TEMPLATE", "Family", "family"]

_SYS_DEFAULT = "You are a helpful assistant."

# ChatML with Hermes-style tools. Every literal newline lives inside a string so the
# whitespace-control flags of whoever renders it cannot change the output.
#: agentloop's ChatML + Hermes-tools template: the hermes family's, and the tiny model's own.
HERMES_TEMPLATE = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content is iterable and content is not mapping -%}"
    "{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set system_text = text(messages[0].content) -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system_text = 'You are a helpful assistant.' -%}{%- set rest = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system_text -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call the functions listed below to help with the "
    "request.\\n\\nTheir signatures are given inside <tools></tools> tags:\\n<tools>' -}}"
    "{%- for t in tools -%}{{- '\\n' + (t | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nTo call a function, answer with a JSON object holding its name and "
    "arguments inside <tool_call></tool_call> tags, like this:\\n<tool_call>\\n"
    '{"name": <function-name>, "arguments": <arguments-json-object>}\\n</tool_call>\' -}}'
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for m in rest -%}"
    "{%- if m.role == 'user' or m.role == 'system' -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + text(m.content) + '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'assistant' -%}"
    "{%- set content = text(m.content) -%}"
    "{{- '<|im_start|>assistant\\n' + content -}}"
    "{%- for call in (m.tool_calls or []) -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": ' + (fn.name | tojson) + ', \"arguments\": ' -}}"
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}"
    "{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + text(m.content) + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- raise_exception('unknown message role: ' + m.role) -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Every literal newline lives inside a string, so whitespace control cannot change the output.
_LLAMA3 = (
    "{{- '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\n' -}}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{{- messages[0].content -}}{%- set rest = messages[1:] -%}"
    "{%- else -%}{{- '" + _SYS_DEFAULT + "' -}}{%- set rest = messages -%}{%- endif -%}"
    "{%- if tools -%}"
    "{{- '\\n\\nEnvironment: ipython\\n\\nYou have access to the following functions. To call a "
    'function, respond with JSON for a function call in the form {"name": function name, '
    '"parameters": dictionary of argument name and its value}. Do not use variables.\' -}}'
    "{%- for t in tools -%}{{- '\\n\\n' + (t | tojson) -}}{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|eot_id|>' -}}"
    "{%- for m in rest -%}"
    "{%- set role = 'ipython' if m.role == 'tool' else m.role -%}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + m.content -}}"
    "{{- '<|eom_id|>' if m.content.startswith('<|python_tag|>') else '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

_MISTRAL = (
    "{{- '<s>' -}}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{{- '[SYSTEM_PROMPT]' + messages[0].content + '[/SYSTEM_PROMPT]' -}}"
    "{%- set rest = messages[1:] -%}{%- else -%}{%- set rest = messages -%}{%- endif -%}"
    "{%- if tools -%}{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' -}}"
    "{%- endif -%}"
    "{%- for m in rest -%}"
    "{%- if m.role == 'user' or m.role == 'system' -%}{{- '[INST]' + m.content + '[/INST]' -}}"
    "{%- elif m.role == 'assistant' -%}{{- m.content + '</s>' -}}"
    "{%- else -%}{{- '[TOOL_RESULTS]' + m.content + '[/TOOL_RESULTS]' -}}{%- endif -%}"
    "{%- endfor -%}"
)

# gpt-oss (harmony). An assistant turn ends with the terminator the model sampled: <|call|> after
# a tool call, else <|return|> (the official template rewrites earlier ones to <|end|>).
_HARMONY = (
    "{{- '<|start|>system<|message|>' -}}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{{- messages[0].content -}}{%- set rest = messages[1:] -%}"
    "{%- else -%}{{- '" + _SYS_DEFAULT + "' -}}{%- set rest = messages -%}{%- endif -%}"
    "{{- '\\nReasoning: medium\\n\\n# Valid channels: analysis, commentary, final. Channel "
    "must be included for every message.' -}}"
    "{%- if tools -%}{{- '\\nCalls to these tools must go to the commentary channel: "
    "\\'functions\\'.' -}}{%- endif -%}"
    "{{- '<|end|>' -}}"
    "{%- if tools -%}"
    "{{- '<|start|>developer<|message|># Tools\\n\\n## functions\\n\\n' -}}"
    "{{- 'namespace functions {\\n\\n' -}}"
    "{%- for t in tools -%}{%- set f = t.function if t.function is defined else t -%}"
    "{{- '// ' + (f.description or '') + '\\ntype ' + f.name + ' = (_: ' -}}"
    "{{- (f.parameters or {}) | tojson -}}{{- ') => any;\\n\\n' -}}{%- endfor -%}"
    "{{- '} // namespace functions<|end|>' -}}"
    "{%- endif -%}"
    "{%- for m in rest -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- set last = m.content.split('<|start|>assistant')[-1] -%}"
    "{{- '<|start|>assistant' + m.content -}}"
    "{{- '<|call|>' if 'to=functions.' in last else '<|return|>' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{{- '<|start|>functions.' + (m.name or 'tool') + ' to=assistant<|channel|>commentary"
    "<|message|>' + m.content + '<|end|>' -}}"
    "{%- else -%}{{- '<|start|>' + m.role + '<|message|>' + m.content + '<|end|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"
)

# GLM-4.5: no end-of-turn token; the model ends its turn by sampling the next role's token
# (<|observation|> before tool results, <|user|>), which are its stop tokens.
_GLM45 = (
    "{{- '[gMASK]<sop>' -}}"
    "{%- if tools -%}"
    "{{- '<|system|>\\n# Tools\\n\\nYou may call one or more functions to assist with the user "
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    "\\n<tools>' -}}"
    "{%- for t in tools -%}{{- '\\n' + (t | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, output the function name and arguments "
    "within the following XML format:\\n<tool_call>{function-name}\\n<arg_key>{arg-key-1}"
    "</arg_key>\\n<arg_value>{arg-value-1}</arg_value>\\n...\\n</tool_call>' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|observation|>' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' -}}"
    "{%- else -%}{{- '<|' + m.role + '|>\\n' + m.content -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)

_QWEN3_CODER = (
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set system_text = messages[0].content -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set system_text = '" + _SYS_DEFAULT + "' -%}{%- set rest = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system_text -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' -}}"
    "{%- for t in tools -%}{%- set f = t.function if t.function is defined else t -%}"
    "{{- '\\n<function>\\n<name>' + f.name + '</name>\\n<description>' + (f.description or '')"
    " + '</description>\\n<parameters>' + ((f.parameters or {}) | tojson) + '</parameters>"
    "\\n</function>' -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format "
    "with NO suffix:\\n\\n<tool_call>\\n<function=example_function_name>\\n<parameter="
    "example_parameter_1>\\nvalue_1\\n</parameter>\\n</function>\\n</tool_call>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for m in rest -%}"
    "{%- if m.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_DEEPSEEK_V3 = (
    "{{- '<｜begin▁of▁sentence｜>' -}}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{{- messages[0].content -}}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set rest = messages -%}{%- endif -%}"
    "{%- if tools -%}"
    "{{- '\\n\\n## Tools\\nYou have access to the following tools:\\n' -}}"
    "{%- for t in tools -%}{%- set f = t.function if t.function is defined else t -%}"
    "{{- '\\n### ' + f.name + '\\nDescription: ' + (f.description or '') + '\\n\\nParameters: '"
    " + ((f.parameters or {}) | tojson) + '\\n' -}}{%- endfor -%}"
    "{{- '\\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\\n<｜tool▁calls▁begin｜>"
    "<｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>"
    "{{additional_tool_calls}}<｜tool▁calls▁end｜>' -}}"
    "{%- endif -%}"
    "{%- for m in rest -%}"
    "{%- if m.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<｜tool▁outputs▁begin｜>' -}}"
    "{%- endif -%}"
    "{{- '<｜tool▁output▁begin｜>' + m.content + '<｜tool▁output▁end｜>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<｜tool▁outputs▁end｜>' -}}"
    "{%- endif -%}"
    "{%- elif m.role == 'assistant' -%}"
    "{{- '<｜Assistant｜>' + m.content + '<｜end▁of▁sentence｜>' -}}"
    "{%- else -%}{{- '<｜User｜>' + m.content -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<｜Assistant｜>' -}}{%- endif -%}"
)


@dataclass(frozen=True)
class Family:
    """One model family's format: its agentloop template, parser and special tokens.

    ``special_tokens`` are the family's own markers this template uses (the first one after
    index 2 that the tokenizer lacks is text, which still works); ``stop_tokens`` end a turn
    (the model's generation config lists them as EOS). ``prefix_stable_official`` classifies
    the family's own template; agentloop's (``chat_template``) is always prefix-stable.
    """

    name: str
    models: str
    parser: str
    chat_template: str
    special_tokens: tuple[str, ...]
    stop_tokens: tuple[str, ...]
    prefix_stable_official: bool
    why: str


#: The special tokens of ChatML templates with Hermes-style tool calls (Qwen2.5, Qwen3-Coder).
_CHATML_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "llama3",
            "Llama 3.1, 3.2, 3.3",
            "llama3_json",
            _LLAMA3,
            (
                "<|begin_of_text|>",
                "<|start_header_id|>",
                "<|eot_id|>",
                "<|end_header_id|>",
                "<|python_tag|>",
                "<|eom_id|>",
            ),
            ("<|eot_id|>", "<|eom_id|>"),
            True,
            "history is rendered as written; tool results are 'ipython' turns",
        ),
        Family(
            "mistral",
            "Mistral, Ministral, Mixtral (tekken v11+ tool format)",
            "mistral",
            _MISTRAL,
            (
                "<s>",
                "[INST]",
                "</s>",
                "[/INST]",
                "[TOOL_CALLS]",
                "[TOOL_RESULTS]",
                "[/TOOL_RESULTS]",
            ),
            ("</s>",),
            False,
            "the official template puts [AVAILABLE_TOOLS] before the *last* user message, so a "
            "new user turn moves it; agentloop's puts it once after the system prompt",
        ),
        Family(
            "harmony",
            "gpt-oss-20b, gpt-oss-120b",
            "harmony",
            _HARMONY,
            (
                "<|start|>",
                "<|call|>",
                "<|return|>",
                "<|message|>",
                "<|channel|>",
                "<|end|>",
                "<|constrain|>",
            ),
            ("<|return|>", "<|call|>"),
            False,
            "the official template drops earlier analysis (reasoning) messages and rewrites "
            "<|return|> to <|end|>; agentloop's keeps both as sampled",
        ),
        Family(
            "glm45",
            "GLM-4.5, GLM-4.5-Air, GLM-4.6",
            "glm45",
            _GLM45,
            (
                "<|endoftext|>",
                "<|user|>",
                "<|observation|>",
                "<|assistant|>",
                "<|system|>",
                "[gMASK]",
                "<sop>",
            ),
            ("<|observation|>", "<|user|>", "<|endoftext|>"),
            False,
            "the official template empties <think> blocks of turns before the last user "
            "message; agentloop's keeps them",
        ),
        Family(
            "qwen3_coder",
            "Qwen3-Coder-30B-A3B, Qwen3-Coder-480B-A35B",
            "qwen3_coder",
            _QWEN3_CODER,
            _CHATML_TOKENS,
            ("<|im_end|>",),
            True,
            "no reasoning blocks; history is rendered as written",
        ),
        Family(
            "deepseek_v3",
            "DeepSeek-V3, V3.1 (non-thinking), R1-0528",
            "deepseek_v3",
            _DEEPSEEK_V3,
            (
                "<｜begin▁of▁sentence｜>",
                "<｜User｜>",
                "<｜end▁of▁sentence｜>",
                "<｜Assistant｜>",
                "<｜tool▁calls▁begin｜>",
                "<｜tool▁call▁begin｜>",
                "<｜tool▁sep｜>",
            ),
            ("<｜end▁of▁sentence｜>",),
            False,
            "the official R1/V3.1-thinking templates drop earlier <think> blocks; agentloop's "
            "keeps them",
        ),
        Family(
            "hermes",
            "Qwen2.5, Qwen2.5-Coder, Hermes 2/3 (the tiny model's own template)",
            "hermes",
            HERMES_TEMPLATE,  # real Qwen2.5 templates work as they are (prefix-stable)
            _CHATML_TOKENS,
            ("<|im_end|>",),
            True,
            "history is rendered as written",
        ),
    )
}


def family(name: str) -> Family:
    """The family called ``name`` (a key of :data:`FAMILIES`)."""
    from agentloop.errors import ConfigError, did_you_mean

    if name not in FAMILIES:
        raise ConfigError(
            f"unknown model family {name!r}.{did_you_mean(name, FAMILIES)} "
            f"Known: {', '.join(FAMILIES)}"
        )
    return FAMILIES[name]
