"""Tool-call parser registry and the hermes parser: edge cases, and it never raises or drops."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop.errors import ToolError
from agentloop.tools import (
    HermesParser,
    ToolCallParser,
    available_parsers,
    get_parser,
    register_parser,
)
from agentloop.types import ToolCall

parser = HermesParser()


def block(obj: Any, pad: str = "") -> str:
    body = obj if isinstance(obj, str) else json.dumps(obj)
    return f"<tool_call>{pad}{body}{pad}</tool_call>"


def test_registry() -> None:
    assert "hermes" in available_parsers()
    p = get_parser("hermes")
    assert isinstance(p, HermesParser) and isinstance(p, ToolCallParser)
    with pytest.raises(ToolError, match=r"Did you mean 'hermes'.*Registered parsers: .*hermes"):
        get_parser("hermess")


def test_register_custom_parser_and_duplicate_names() -> None:
    @register_parser("test-upper")
    class Upper:
        def parse(self, text: str) -> tuple[ToolCall, ...]:
            return (ToolCall(name=text.upper()),)

    assert get_parser("test-upper").parse("x") == (ToolCall(name="X"),)
    register_parser("test-upper")(Upper)  # the same object again is fine (re-import)
    with pytest.raises(ToolError, match="already registered"):
        register_parser("test-upper")(HermesParser)


def test_no_calls() -> None:
    assert parser.parse("The answer is \\boxed{4}.") == ()
    assert parser.parse("") == ()


def test_multiple_calls_with_text_around_and_whitespace() -> None:
    text = (
        "Let me compute.\n"
        + block({"name": "python", "arguments": {"code": "print(1)"}}, pad="\n")
        + "\nand also  "
        + block({"name": "search", "arguments": {"query": "x", "k": 3}}, pad=" \t\n ")
        + " done."
    )
    calls = parser.parse(text)
    assert [(c.name, dict(c.arguments), c.id) for c in calls] == [
        ("python", {"code": "print(1)"}, "call_0"),
        ("search", {"query": "x", "k": 3}, "call_1"),
    ]
    assert all(c.parse_error is None for c in calls)
    assert calls[0].raw.startswith("<tool_call>") and calls[0].raw.endswith("</tool_call>")
    assert calls[0].raw in text


def test_nested_braces_and_tags_inside_strings() -> None:
    code = 'd = {"a": {"b": [1, 2]}}\nprint("}</tool_call>{")'
    [c] = parser.parse(block({"name": "python", "arguments": {"code": code}}))
    assert c.parse_error is None and c.arguments["code"] == code


def test_arguments_as_json_string_and_missing_arguments() -> None:
    text = block({"name": "f", "arguments": json.dumps({"x": [1, {"y": 2}]})}) + block(
        {"name": "g"}
    )
    [f, g] = parser.parse(text)
    assert dict(f.arguments) == {"x": [1, {"y": 2}]} and f.parse_error is None
    assert g.name == "g" and dict(g.arguments) == {} and g.parse_error is None


@pytest.mark.parametrize(
    ("body", "name", "needle"),
    [
        ('{"name": "f", "arguments": {"x": 1,}}', "f", "invalid JSON (Expecting property name"),
        ("[1, 2]", "", "got a JSON list"),
        ('"just a string"', "", "got a JSON str"),
        ('{"arguments": {}}', "", '"name" is missing'),
        ('{"name": 3, "arguments": {}}', "", '"name" must be a string, got 3'),
        ('{"name": "", "arguments": {}}', "", '"name" is empty'),
        (
            '{"name": "f", "arguments": [1]}',
            "f",
            '"arguments" must be a JSON object, got a JSON list',
        ),
        ('{"name": "f", "arguments": "[1]"}', "f", '"arguments" is a string that does not hold'),
        ('{"name": "f", "arguments": "{bad"}', "f", '"arguments" is a string that does not hold'),
        ('{"name": "f", "arguments": {}} trailing', "f", "invalid JSON (Extra data at line 1"),
        ("   ", "", "empty <tool_call></tool_call> block"),
        ("[" * 100_000, "", "invalid JSON"),
    ],
)
def test_bad_blocks_become_error_calls(body: str, name: str, needle: str) -> None:
    text = "before " + block(body) + " after " + block({"name": "ok", "arguments": {}})
    bad, ok = parser.parse(text)
    assert bad.name == name and bad.parse_error is not None and needle in bad.parse_error
    assert bad.id == "call_0" and bad.raw == block(body) and dict(bad.arguments) == {}
    assert ok.name == "ok" and ok.parse_error is None and ok.id == "call_1"


def test_unclosed_tag_at_end() -> None:
    text = block({"name": "a", "arguments": {}}) + '<tool_call>{"name": "python", "arguments": {"co'
    good, cut = parser.parse(text)
    assert good.parse_error is None
    assert cut.name == "python" and cut.id == "call_1"
    assert cut.parse_error is not None and "unclosed <tool_call>" in cut.parse_error
    assert cut.raw == '<tool_call>{"name": "python", "arguments": {"co'


def test_complete_json_without_closing_tag_is_still_an_error() -> None:
    [c] = parser.parse('<tool_call>{"name": "f", "arguments": {}}')
    assert c.name == "f" and c.parse_error is not None and "unclosed" in c.parse_error


def test_open_tag_followed_by_another_call() -> None:
    text = "<tool_call>oops " + block({"name": "b", "arguments": {"x": 1}})
    first, second = parser.parse(text)
    assert first.parse_error is not None and "unclosed" in first.parse_error
    assert first.raw == "<tool_call>oops "
    assert second.name == "b" and second.parse_error is None and second.id == "call_1"


FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "{",
    "}",
    "[",
    "]",
    '"name"',
    '"arguments"',
    ":",
    ",",
    '"f"',
    "1",
    " ",
    "\n",
    "\\",
    '"',
    "text",
    "<tool_",
    "null",
]


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(), st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join)))
def test_parse_never_raises_or_drops(text: str) -> None:
    calls = parser.parse(text)
    assert isinstance(calls, tuple)
    opens = text.count("<tool_call>")
    assert len(calls) <= opens and (len(calls) >= 1) == (opens >= 1)
    for i, c in enumerate(calls):
        assert isinstance(c, ToolCall) and c.id == f"call_{i}" and c.raw in text
        assert c.parse_error is not None or c.name


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)
valid_calls = st.lists(
    st.tuples(
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True),
        st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    ),
    max_size=4,
)
prose = st.text(max_size=30).filter(lambda s: "<tool_call>" not in s)


@settings(max_examples=100, deadline=None)
@given(valid_calls, prose, st.sampled_from(["", "\n", " "]))
def test_well_formed_calls_round_trip(
    calls: list[tuple[str, dict[str, Any]]], gap: str, pad: str
) -> None:
    text = gap.join(block({"name": n, "arguments": a}, pad=pad) for n, a in calls)
    parsed = parser.parse(gap + text + gap)
    assert [(c.name, dict(c.arguments)) for c in parsed] == calls
    assert all(c.parse_error is None for c in parsed)


def test_detection_markers_are_declared_with_the_parser() -> None:
    from agentloop.tools import detect_parser

    @register_parser("test-marked", markers=("<zz_call>", "<zz_args>"))
    class Marked:
        def parse(self, text: str, tools: Any = None) -> tuple[ToolCall, ...]:
            return ()

    assert detect_parser("... <zz_call> ... <zz_args> ...") == "test-marked"
    assert detect_parser("... <zz_call> only ...") is None  # every marker must be there
    # GLM's template holds <tool_call> too: the parser with more markers wins, in no hidden order
    assert detect_parser("<tool_call>{name}<arg_key>k</arg_key>") == "glm45"
    assert detect_parser("<tool_call>{...}</tool_call>") == "hermes"

    @register_parser("test-rival", markers=("<zz_call>", "<zz_other>"))
    class Rival(Marked):
        pass

    with pytest.raises(ToolError, match=r"several tool-call formats: test-marked, test-rival"):
        detect_parser("<zz_call><zz_args><zz_other>")
