"""Every family's parser against vLLM's own parser of that family, on many generated replies.

vLLM is the oracle: for each family, replies with single and parallel calls, unicode, nested
objects, values that look like other types (the string ``"42"``, ``"true"``, ``"[1, 2]"``) and
text around the calls are parsed by agentloop's parser and by vLLM's (``vllm.tool_parsers``,
picked by its ``ToolParserManager`` name, given a ``ChatCompletionRequest`` with the tools so
that it types values by their schemas), and the calls must agree: names, and arguments with
their JSON types. No engine starts: the parser classes and a tokenizer (the tiny one, with the
family's markers added as special tokens where vLLM's parser looks them up) are all it needs.

Malformed replies (cut off, broken JSON, a missing name or tag) are held to agentloop's rule
that a call is never dropped: the calls agentloop can read are the ones vLLM reads (or vLLM gave
up on the whole reply), and every call it cannot read is an error call the model is shown.

The content text is not compared: agentloop keeps the raw reply as the message content (the
trajectory is token-exact), so it has no "content without the calls" to hold against vLLM's.
Where agentloop departs from vLLM on a well-formed reply, :data:`DEVIATIONS` says why.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from agentloop.tools import ToolSchemas, get_parser
from agentloop.types import ToolCall

pytest.importorskip("vllm.tool_parsers")

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": props},
        },
    }
    for name, props in {
        "search": {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "exact": {"type": "boolean"},
        },
        "run_code": {
            "code": {"type": "string"},
            "timeout": {"type": "number"},
            "env": {"type": "object"},
        },
        "tag": {
            "labels": {"type": "array", "items": {"type": "string"}},
            "meta": {"type": "object", "properties": {"id": {"type": "integer"}}},
            "note": {"type": ["string", "null"]},
        },
    }.items()
]
SCHEMAS = ToolSchemas.of(TOOLS)

#: strings that read as another JSON type: a ``string`` parameter must keep them as written
LOOKALIKES = ("42", "true", "[1, 2]", "null", "3.5", '{"a": 1}', "-0", "1e3")
TEXTS = (
    "héllo wörld",
    "日本語のテキスト ✓",
    "emoji 🎉 and ünïcödé",
    "a < b && c > d",
    "two\nlines",
)


def _value(rng: random.Random, schema: dict[str, Any]) -> Any:
    """A value of ``schema``'s type (strings mostly look like other types or are unicode)."""
    kind = schema["type"] if isinstance(schema["type"], str) else rng.choice(schema["type"])
    if kind == "string":
        return rng.choice((*LOOKALIKES, *TEXTS))
    if kind == "integer":
        return rng.choice((0, 7, -3, 123456789))
    if kind == "number":
        return rng.choice((2.5, -0.125, 10, 1e-3))
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        return [rng.choice(TEXTS + LOOKALIKES) for _ in range(rng.randint(0, 3))]
    nested = {"id": rng.randint(1, 99), "deep": {"list": [1, {"x": "ÿ"}], "flag": False}}
    return rng.choice(({}, nested, {"path": "/tmp/ü", "n": [1.5, None]}))


def _calls(rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    """One to three calls of the test's tools, each with a random subset of its parameters."""
    out = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        spec = rng.choice(TOOLS)["function"]
        props = spec["parameters"]["properties"]
        keys = [k for k in props if rng.random() < 0.8]
        out.append((spec["name"], {k: _value(rng, props[k]) for k in keys}))
    return out


def _text(value: Any) -> str:
    """How an XML format writes a value: strings bare, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _dumps(args: dict[str, Any]) -> str:
    return json.dumps(args, ensure_ascii=False)


_DS = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
_DS_END = "<｜tool▁calls▁end｜>"

#: how each format writes calls (its documented layout), and the text it allows around them
WRITERS: dict[str, Callable[[list[tuple[str, dict[str, Any]]]], str]] = {
    "hermes": lambda calls: "".join(
        f'<tool_call>\n{{"name": "{n}", "arguments": {_dumps(a)}}}\n</tool_call>\n'
        for n, a in calls
    ),
    "llama3_json": lambda calls: (
        "<|python_tag|>"
        + "; ".join(f'{{"name": "{n}", "parameters": {_dumps(a)}}}' for n, a in calls)
    ),
    "mistral": lambda calls: "".join(f"[TOOL_CALLS]{n}[ARGS]{_dumps(a)}" for n, a in calls),
    "mistral_v3": lambda calls: (
        "[TOOL_CALLS]"
        + json.dumps([{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False)
    ),
    "glm45": lambda calls: "".join(
        f"<tool_call>{n}\n"
        + "".join(
            f"<arg_key>{k}</arg_key>\n<arg_value>{_text(v)}</arg_value>\n" for k, v in a.items()
        )
        + "</tool_call>"
        for n, a in calls
    ),
    "qwen3_coder": lambda calls: "".join(
        f"<tool_call>\n<function={n}>\n"
        + "".join(f"<parameter={k}>\n{_text(v)}\n</parameter>\n" for k, v in a.items())
        + "</function>\n</tool_call>\n"
        for n, a in calls
    ),
    "deepseek_v31": lambda calls: (
        _DS[0] + "".join(f"{_DS[1]}{n}{_DS[2]}{_dumps(a)}{_DS[3]}" for n, a in calls) + _DS_END
    ),
    "deepseek_v3": lambda calls: (
        _DS[0]
        + "".join(
            f"{_DS[1]}function{_DS[2]}{n}\n```json\n{_dumps(a)}\n```{_DS[3]}" for n, a in calls
        )
        + _DS_END
    ),
}
AROUND: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # (prefixes, suffixes)
    "hermes": (("", "Let me look.\n", "考えます…\n"), ("", "\n")),
    "llama3_json": (("",), ("",)),  # the documented reply is the JSON alone
    "mistral": (("", "Sure — checking.\n"), ("",)),
    "mistral_v3": (("", "Sure — checking.\n"), ("",)),
    "glm45": (("", "I'll search.\n", "😀 "), ("", "\n")),
    "qwen3_coder": (("", "Running it now.\n"), ("",)),
    "deepseek_v31": (("", "Let me check.\n"), ("",)),
    "deepseek_v3": (("", "Let me check.\n"), ("",)),
}


class Oracle(NamedTuple):
    parser: str  # agentloop's parser name
    vllm: str  # vLLM's ToolParserManager name
    tokens: str  # which test tokenizer: "full", or "v3" (no [ARGS]: a pre-v11 Mistral tokenizer)


#: each wire format → agentloop's parser and vLLM's parser of that format
ORACLES = {
    "hermes": Oracle("hermes", "hermes", "full"),
    "llama3_json": Oracle("llama3_json", "llama3_json", "full"),
    "mistral": Oracle("mistral", "mistral", "full"),
    "mistral_v3": Oracle("mistral", "mistral", "v3"),
    "glm45": Oracle("glm45", "glm45", "full"),
    "qwen3_coder": Oracle("qwen3_coder", "qwen3_coder", "full"),
    "deepseek_v31": Oracle("deepseek_v3", "deepseek_v31", "full"),  # V3.1's format
    "deepseek_v3": Oracle("deepseek_v3", "deepseek_v3", "full"),  # V3 / R1-0528's format
}

#: markers vLLM's parsers look up in the vocabulary (added to the tiny tokenizer as specials)
MARKERS = (
    "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", *_DS, _DS_END, "<arg_key>", "</arg_key>",
    "<arg_value>", "</arg_value>", "<think>", "</think>",
)  # fmt: skip


def well_formed(fmt: str, n: int = 34) -> Iterator[str]:
    rng = random.Random(f"{fmt}-41")
    prefixes, suffixes = AROUND[fmt]
    for _ in range(n):
        yield rng.choice(prefixes) + WRITERS[fmt](_calls(rng)) + rng.choice(suffixes)


#: replies that do not read as the format's calls: cut off, broken JSON, missing names or tags
MALFORMED: dict[str, tuple[str, ...]] = {
    "hermes": (
        '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "tag", "arguments": {"labels": [1,}}\n</tool_call>',
        '<tool_call>\n{"name": "search", "arguments": {"query": "cut off',
        '<tool_call>\n{"arguments": {"query": "no name"}}\n</tool_call>',
        "<tool_call>\nnot json at all\n</tool_call>",
        '<tool_call>{"name": "search", "arguments": {"query": "a"}}',
    ),
    "llama3_json": (
        '{"name": "search", "parameters": {"query": "cut',
        '<|python_tag|>{"parameters": {"query": "no name"}}',
        '{"name": "search", "parameters": {"query": "a"}}; {"name": "tag", "parameters": {',
    ),
    "mistral": (
        "[TOOL_CALLS]search[ARGS]{oops}",
        '[TOOL_CALLS]search[ARGS]{"query": "cut off',
        '[TOOL_CALLS]search[ARGS]{"query": "a"}[TOOL_CALLS]tag[ARGS]{"labels": [',
    ),
    "mistral_v3": (
        '[TOOL_CALLS][{"name": "search", "arguments": {"query": "cut',
        "[TOOL_CALLS]not json",
    ),
    "glm45": (
        "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>cut off",
        "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>x</arg_value>\n</tool_call>"
        "<tool_call>tag\n<arg_key>labels</arg_key>",
        "<tool_call>search\n<arg_key>query",
    ),
    "qwen3_coder": (
        "<tool_call>\n<function=search>\n<parameter=query>\ncut off\n",
        "<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n</tool_call>",
        "<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n</function>\n"
        "</tool_call>\n<tool_call>\n<function=tag>\n",
    ),
    "deepseek_v31": (
        f"{_DS[0]}{_DS[1]}search{_DS[2]}{{bad json}}{_DS[3]}{_DS_END}",
        f'{_DS[0]}{_DS[1]}search{_DS[2]}{{"query": "cut off',
        f"{_DS[0]}{_DS[1]}search no separator{_DS[3]}{_DS_END}",
    ),
    "deepseek_v3": (
        f'{_DS[0]}{_DS[1]}function{_DS[2]}search\n```json\n{{"query": "cut',
        f"{_DS[0]}{_DS[1]}function{_DS[2]}search\n```json\n{{oops}}\n```{_DS[3]}{_DS_END}",
    ),
}


#: replies outside the documented layout that vLLM and agentloop both read, and read alike
LENIENT: dict[str, tuple[str, ...]] = {
    "qwen3_coder": ("<function=search>\n<parameter=query>\nx\n</parameter>\n</function>",),
    "llama3_json": ('{"name": "search", "parameters": {"query": "x"}} and then some text',),
}


class Deviation(NamedTuple):
    name: str
    fmt: str
    text: str
    vllm: list[tuple[str, Any]]  # what vLLM's parser gives
    ours: list[tuple[str, Any]]  # what agentloop gives: the family's documented format
    why: str


DEVIATIONS = (
    Deviation(
        "glm-unknown-tool",
        "glm45",
        "<tool_call>web_fetch\n<arg_key>url</arg_key>\n<arg_value>https://x.org</arg_value>\n"
        "</tool_call>",
        [],
        [("web_fetch", {"url": "https://x.org"})],
        "vLLM's GLM parser drops a call to a tool the request does not list (its "
        "validate_tool_names); the reply then reads as a final answer. agentloop keeps the "
        "call, and the dispatcher answers it with an unknown_tool error the model sees",
    ),
    Deviation(
        "glm-json-body",
        "glm45",
        '<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>',
        [],
        [("search", {"query": "x"})],
        "GLM-4's JSON body in <tool_call> (the format GLM-4-0414 documents): vLLM's GLM-4.5 "
        "parser takes the JSON for a tool name and drops the call; agentloop reads it",
    ),
    Deviation(
        "mistral-retyped-json",
        "mistral",
        '[TOOL_CALLS]search[ARGS]{"query": 42, "limit": "7", "exact": 1}',
        [("search", {"query": "42", "limit": 7, "exact": True})],
        [("search", {"query": 42, "limit": "7", "exact": 1})],
        "the arguments are JSON (mistral-common's [TOOL_CALLS]name[ARGS]{json}): the model "
        "wrote their types. vLLM's Mistral parser re-types them by the schema, which its own "
        "hermes, llama3_json and deepseek parsers do not do on the same JSON; agentloop keeps "
        "what the model wrote, and the tool's argument check tells the model the type is wrong",
    ),
    Deviation(
        "llama-call-in-prose",
        "llama3_json",
        'Let me search. {"name": "search", "parameters": {"query": "x"}}',
        [("search", {"query": "x"})],
        [],
        "Llama 3.1's documented JSON tool call is the whole reply ('respond with JSON for a "
        'function call in the form {"name": ..., "parameters": ...}\', Meta\'s prompt '
        "format and agentloop's llama3 template). vLLM reads a call out of any '{' in prose, so "
        "an answer that quotes such a JSON example would run a tool",
    ),
    Deviation(
        "hermes-string-arguments",
        "hermes",
        '<tool_call>\n{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}\n</tool_call>',
        [("search", '{"query": "x"}')],
        [("search", {"query": "x"})],
        "arguments written as a JSON string holding the object: vLLM passes the string on "
        "(JSON-encoded twice, so no tool reads it as its arguments); agentloop decodes it",
    ),
)


def _typed(args: Any) -> str:
    """Arguments in a form where types count (``1``, ``1.0``, ``True`` and ``"1"`` differ)."""
    return json.dumps(args, ensure_ascii=False, sort_keys=True)


@pytest.fixture(scope="module")
def vllm_tokenizers(tiny_model_dir: Path) -> dict[str, Any]:
    """The tiny tokenizer with every family's markers as special tokens, and (``v3``) without
    ``[ARGS]``: vLLM reads ``[TOOL_CALLS][...]`` JSON lists only for a pre-v11 Mistral vocab."""
    from transformers import AutoTokenizer

    made = {}
    for name, markers in (("full", MARKERS), ("v3", tuple(m for m in MARKERS if m != "[ARGS]"))):
        tok = AutoTokenizer.from_pretrained(tiny_model_dir)
        tok.add_special_tokens({"additional_special_tokens": list(markers)})
        made[name] = tok
    return made


def vllm_parse(fmt: str, text: str, tokenizers: dict[str, Any]) -> list[tuple[str, str]]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager

    oracle = ORACLES[fmt]
    request = ChatCompletionRequest(
        model="tiny", messages=[{"role": "user", "content": "hi"}], tools=TOOLS
    )
    parser = ToolParserManager.get_tool_parser(oracle.vllm)(
        tokenizers[oracle.tokens], request.tools
    )
    result = parser.extract_tool_calls(text, request)
    return [(c.function.name, _json_or_raw(c.function.arguments)) for c in result.tool_calls]


def _json_or_raw(arguments: str) -> str:
    """vLLM passes arguments it cannot read through as text (a call no tool could run)."""
    try:
        return _typed(json.loads(arguments))
    except ValueError:
        return f"unreadable: {arguments}"


def ours(fmt: str, text: str) -> tuple[ToolCall, ...]:
    return get_parser(ORACLES[fmt].parser).parse(text, SCHEMAS)


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_well_formed_replies_parse_as_vllm_parses_them(
    fmt: str, vllm_tokenizers: dict[str, Any]
) -> None:
    replies = list(well_formed(fmt))
    assert len({*replies}) >= 30  # distinct outputs per format
    for text in replies:
        calls = ours(fmt, text)
        assert all(c.parse_error is None for c in calls), (text, calls)
        got = [(c.name, _typed(dict(c.arguments))) for c in calls]
        assert got == vllm_parse(fmt, text, vllm_tokenizers), text
        assert got  # every reply holds at least one call


@pytest.mark.parametrize("fmt", sorted(MALFORMED))
def test_malformed_replies_keep_what_vllm_reads_and_flag_the_rest(
    fmt: str, vllm_tokenizers: dict[str, Any]
) -> None:
    for text in MALFORMED[fmt]:
        calls = ours(fmt, text)
        theirs = vllm_parse(fmt, text, vllm_tokenizers)
        good = [(c.name, _typed(dict(c.arguments))) for c in calls if c.parse_error is None]
        errors = [c for c in calls if c.parse_error is not None]
        assert errors, (text, calls)  # the broken call is shown to the model, not dropped
        assert not theirs or all(call in theirs for call in good), (text, good, theirs)
        assert len([c for c in theirs if c not in good]) <= len(errors), (text, theirs, calls)


@pytest.mark.parametrize("fmt", sorted(LENIENT))
def test_replies_outside_the_layout_read_alike(fmt: str, vllm_tokenizers: dict[str, Any]) -> None:
    for text in LENIENT[fmt]:
        calls = ours(fmt, text)
        assert calls and all(c.parse_error is None for c in calls), (text, calls)
        got = [(c.name, _typed(dict(c.arguments))) for c in calls]
        assert got == vllm_parse(fmt, text, vllm_tokenizers), text


@pytest.mark.parametrize("case", DEVIATIONS, ids=lambda d: d.name)
def test_where_vllm_departs_from_the_documented_format(
    case: Deviation, vllm_tokenizers: dict[str, Any]
) -> None:
    theirs = [(n, _typed(a)) for n, a in case.vllm]
    assert vllm_parse(case.fmt, case.text, vllm_tokenizers) == theirs  # vLLM still does this
    calls = ours(case.fmt, case.text)
    assert all(c.parse_error is None for c in calls)
    assert [(c.name, _typed(dict(c.arguments))) for c in calls] == [
        (n, _typed(a)) for n, a in case.ours
    ]
