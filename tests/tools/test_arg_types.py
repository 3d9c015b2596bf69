"""Values of the untyped XML formats (GLM-4.5, Qwen3-Coder) typed by the tool's JSON schema."""

from __future__ import annotations

from typing import Any

import pytest

from agentloop.tools import ToolSchemas, get_parser
from agentloop.tools.arg_types import coerce_value

TOOLS = ToolSchemas.of([
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {
                    "s": {"type": "string"},
                    "n": {"type": "integer"},
                    "x": {"type": "number"},
                    "b": {"type": "boolean"},
                    "l": {"type": "array", "items": {"type": "integer"}},
                    "o": {"type": "object"},
                    "u": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                },
            },
        },
    }
])  # fmt: skip


def glm(name: str, **args: str) -> str:
    pairs = "".join(
        f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in args.items()
    )
    return f"<tool_call>{name}\n{pairs}</tool_call>"


def qwen(name: str, **args: str) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


@pytest.mark.parametrize(("parser", "write"), [("glm45", glm), ("qwen3_coder", qwen)])
def test_a_string_parameter_stays_the_string_the_model_wrote(parser: str, write: Any) -> None:
    # the cases of issue 41: each of these was turned into JSON (42, True, [1, 2]) before
    for text in ("42", "true", "[1, 2]", "null", '{"a": 1}', "3.5"):
        (call,) = get_parser(parser).parse(write("f", s=text), TOOLS)
        assert call.parse_error is None and call.arguments == {"s": text}


@pytest.mark.parametrize(("parser", "write"), [("glm45", glm), ("qwen3_coder", qwen)])
def test_other_parameters_are_typed_by_their_schema(parser: str, write: Any) -> None:
    text = write("f", n="42", x="2.5", b="true", l="[1, 2]", o='{"k": [1]}', u="null")
    (call,) = get_parser(parser).parse(text, TOOLS)
    assert call.arguments == {"n": 42, "x": 2.5, "b": True, "l": [1, 2], "o": {"k": [1]}, "u": None}
    (unknown,) = get_parser(parser).parse(write("g", n="42"), TOOLS)  # no schema: a string
    assert unknown.arguments == {"n": "42"}
    (untyped,) = get_parser(parser).parse(write("f", n="42"))  # no tools given: strings
    assert untyped.arguments == {"n": "42"}


@pytest.mark.parametrize(
    ("text", "schema", "expected"),
    [
        ("42", {"type": "integer"}, 42),
        ("4.5", {"type": "integer"}, 4.5),  # not an integer: read as JSON, as vLLM does
        ("abc", {"type": "integer"}, "abc"),
        ("3.0", {"type": "number"}, 3),  # an integral number is an int
        ("1e999", {"type": "number"}, "1e999"),  # not finite: stays text
        ("1", {"type": "boolean"}, True),
        ("FALSE", {"type": "boolean"}, False),
        ("null", {"type": ["integer", "null"]}, None),
        ("7", {"type": ["integer", "null"]}, 7),
        ("b", {"enum": ["a", "b"]}, "b"),
        ("2", {"enum": [1, 2]}, 2),
        ("[1]", {"type": "object"}, [1]),  # JSON that parses is kept, whatever its type
        ("x", {}, "x"),  # a schema without a type: a string
        ("12", {"type": "int64"}, 12),  # type aliases models' schemas use
    ],
)
def test_coerce_value_follows_vllms_rules(text: str, schema: Any, expected: Any) -> None:
    got = coerce_value(text, schema)
    assert got == expected and type(got) is type(expected)
