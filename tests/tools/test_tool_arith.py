"""safe_exec and the python tool: the allowed arithmetic subset, and clear errors for the rest."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop.errors import ToolError
from agentloop.tools import ToolErrorKind, Toolset, python, safe_exec
from agentloop.types import ToolCall


@pytest.mark.parametrize(
    ("code", "output"),
    [
        ("347 * 29 + 18", "10081"),
        ("x = 347 * 29\nprint(x + 18)", "10081"),
        ("print(7 / 2, 7 // 2, 7 % 3, -2 ** 2, (-2) ** 2)", "3.5 3 1 -4 4"),
        ("a = b = 3\na += 2\nb *= a\nprint(a)\nb", "5\n15"),
        ("x = 2\nx ** 10\nx + 1", "3"),  # only the final expression is echoed
        ("x = 1", ""),
        ("print()", ""),
        ("1.5 * 2", "3.0"),
        ("abs(-3) + max(1, 2, 3) + min(4, 5) + round(2.567, 2)", "12.57"),
        ("int(7 / 2) + float(1)", "4.0"),
        ("2 ** -1", "0.5"),
        ("# just a comment\n\n10 - +3", "7"),
    ],
)
def test_allowed(code: str, output: str) -> None:
    assert safe_exec(code) == output


@pytest.mark.parametrize(
    ("code", "needles"),
    [
        ("import os", ["line 1", "Import", "not allowed", "Allowed:"]),
        ("__import__('os')", ["calling '__import__' is not allowed"]),
        ("'a' * 3", ["the literal 'a' is not allowed"]),
        ("x = 1\n(1).__class__", ["line 2", "Attribute"]),
        ("for i in [1]:\n    print(i)", ["For"]),
        ("x[0] = 1", ["simple names"]),
        ("print(1, sep='')", ["keyword arguments to print()"]),
        ("lambda: 1", ["Lambda"]),
        ("True + 1", ["the literal True is not allowed"]),
        ("1 << 3", ["BinOp", "not allowed"]),
        ("y + 1", ["name 'y' is not defined"]),
        ("1 / 0", ["ZeroDivisionError: division by zero"]),
        ("x = 1\ny = x % 0", ["line 2", "ZeroDivisionError"]),
        ("10 ** 10 ** 9", ["result too large"]),
        ("9 ** 99999", ["result too large"]),
        ("x = 2 ** 9000\nx * x", ["line 2", "result too large"]),
        ("1.5 ** 10000", ["OverflowError"]),
        ("(-8) ** 0.5", ["complex"]),
        ("round(5, -10 ** 9)", ["round() digits"]),
        ("print(", ["syntax error at line 1"]),
        ("+".join(["1"] * 4000), ["nested too deeply"]),
        ("1" * 10_001, ["limit is 10000"]),
    ],
)
def test_rejected(code: str, needles: list[str]) -> None:
    start = time.monotonic()
    with pytest.raises(ToolError) as info:
        safe_exec(code)
    assert time.monotonic() - start < 1.0
    for needle in needles:
        assert needle in str(info.value)


def test_python_tool_schema_and_direct_call() -> None:
    assert python.name == "python"
    assert python.parameters["required"] == ["code"]
    assert python("print(6 * 7)") == "42"
    assert "no output" in python("x = 1")


async def test_python_tool_through_dispatch() -> None:
    calls = [
        ToolCall(name="python", arguments={"code": "x = 12\nprint(x * x)"}, id="call_0"),
        ToolCall(name="python", arguments={"code": "open('/etc/passwd')"}, id="call_1"),
    ]
    async with Toolset([python]).session() as session:
        ok, bad = await session.dispatch(calls)
    assert ok.content == "144" and ok.error_kind is None
    assert bad.error_kind is ToolErrorKind.TOOL_EXCEPTION
    assert bad.content.startswith(
        "Error: tool 'python' failed: line 1: calling 'open' is not allowed"
    )


FRAGMENTS = ["1", "9", "0", "2.5", "x", "y", "=", "+", "-", "*", "/", "//", "%", "**", "(", ")"]
FRAGMENTS += ["print(", "max(", "round(", ",", "\n", " ", "+=", "'s'", "[", "import", "."]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=30).map("".join))
def test_safe_exec_returns_text_or_raises_tool_error(code: str) -> None:
    start = time.monotonic()
    try:
        out = safe_exec(code)
    except ToolError as e:
        assert str(e)
    else:
        assert isinstance(out, str)
    assert time.monotonic() - start < 1.0
