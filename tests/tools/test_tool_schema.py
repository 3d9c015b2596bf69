"""@tool: schemas from hints + docstrings, decoration-time errors, argument validation messages."""

from __future__ import annotations

import enum
import pickle
from typing import Literal

import pytest

from agentloop.errors import ToolError
from agentloop.tools import Tool, ToolContext, tool


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@tool
def weather(city: str, unit: Unit = Unit.CELSIUS, days: int = 1) -> str:
    """Get the weather forecast for a city.

    Uses the local forecast service.

    Args:
        city: Name of the city,
            e.g. "Paris".
        unit: Temperature unit.
        days: Number of days to forecast.
    """
    return f"{city} {unit.value} {days}"


@tool(name="lookup", timeout_s=5, max_concurrency=3, rate_limit_per_s=10.0)
async def lookup_impl(
    keys: list[str],
    weights: dict[str, float],
    mode: Literal["fast", "exact"],
    level: Level,
    limit: int | None,
    flag: bool = False,
    scale: float | None = 1.5,
) -> dict[str, int]:
    """Look up keys.

    Args:
        keys: Keys to look up.
        weights: Weight per key.
        mode: Search mode.
        level: Effort level.
        limit: Max results (none for all).
        flag: A flag.
        scale: A scale factor.
    """
    return {k: len(k) for k in keys}


def params(t: Tool) -> dict[str, dict[str, object]]:
    return t.parameters["properties"]  # type: ignore[no-any-return]


def test_schema_is_openai_function_style() -> None:
    schema = weather.schema
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "weather"
    assert (
        fn["description"]
        == "Get the weather forecast for a city.\n\nUses the local forecast service."
    )
    assert fn["parameters"]["type"] == "object"
    assert fn["parameters"]["required"] == ["city"]
    # a copy: mutating it does not change the tool
    fn["parameters"]["required"].append("x")
    assert weather.parameters["required"] == ["city"]


def test_defaults_enums_and_multiline_descriptions() -> None:
    p = params(weather)
    assert p["city"] == {"type": "string", "description": 'Name of the city, e.g. "Paris".'}
    assert p["unit"] == {
        "type": "string",
        "enum": ["celsius", "fahrenheit"],
        "description": "Temperature unit.",
        "default": "celsius",
    }
    assert p["days"] == {
        "type": "integer",
        "description": "Number of days to forecast.",
        "default": 1,
    }


def test_lists_dicts_literal_int_enum_optional() -> None:
    p = params(lookup_impl)
    assert p["keys"]["type"] == "array" and p["keys"]["items"] == {"type": "string"}
    assert p["weights"]["additionalProperties"] == {"type": "number"}
    assert p["mode"]["enum"] == ["fast", "exact"] and p["mode"]["type"] == "string"
    assert p["level"] == {"type": "integer", "enum": [1, 2], "description": "Effort level."}
    assert p["limit"]["type"] == ["integer", "null"] and p["limit"]["default"] is None
    assert p["flag"] == {"type": "boolean", "description": "A flag.", "default": False}
    assert p["scale"]["type"] == ["number", "null"] and p["scale"]["default"] == 1.5
    # T | None without a default is optional (defaults to None); defaults are not required
    assert lookup_impl.parameters["required"] == ["keys", "weights", "mode", "level"]
    assert "$ref" not in repr(lookup_impl.parameters) and "$defs" not in repr(
        lookup_impl.parameters
    )


def test_options_are_kept() -> None:
    assert lookup_impl.name == "lookup"
    assert lookup_impl.timeout_s == 5.0 and isinstance(lookup_impl.timeout_s, float)
    assert lookup_impl.max_concurrency == 3 and lookup_impl.rate_limit_per_s == 10.0
    assert lookup_impl.is_async and not weather.is_async


def test_optional_union_of_list_uses_any_of() -> None:
    @tool
    def f(tags: list[int] | None = None, x: int | str = 1) -> str:
        """F.

        Args:
            tags: Tags.
            x: Either.
        """
        return ""

    assert params(f)["tags"]["anyOf"] == [
        {"type": "array", "items": {"type": "integer"}},
        {"type": "null"},
    ]
    assert params(f)["x"]["anyOf"] == [{"type": "integer"}, {"type": "string"}]


def test_calling_the_tool_calls_the_function() -> None:
    assert weather("Oslo", days=3) == "Oslo celsius 3"


def test_context_parameter_is_excluded_from_schema() -> None:
    @tool
    def remember(ctx: ToolContext, value: str) -> str:
        """Remember a value.

        Args:
            value: What to remember.
        """
        ctx.state["v"] = value
        return "ok"

    assert list(params(remember)) == ["value"]
    assert remember.context_param == "ctx"
    assert remember.bind_arguments({"value": "a"}) == {"value": "a"}


def test_no_parameters_needs_no_args_section() -> None:
    @tool
    def now() -> str:
        """Current time."""
        return "noon"

    assert now.parameters == {"type": "object", "properties": {}, "required": []}


def _undocumented(x: int) -> int:
    return x


def _bad_hint(x: set[int]) -> int:
    """Bad.

    Args:
        x: A set.
    """
    return 0


@pytest.mark.parametrize(
    ("fn_source", "needles"),
    [
        ("def f(x: int) -> int:\n    return x", ["f", "no docstring", "Args:"]),
        (
            'def f(x: int, y: int) -> int:\n    """Add.\n\n    Args:\n        x: X.\n    """',
            ["'y' is not described", "add 'y: <what it is>' under 'Args:'"],
        ),
        (
            'def f(x: int) -> int:\n    """Add.\n\n    Args:\n        x: X.\n        z: Z.\n"""',
            ["['z']", "no such parameter"],
        ),
        (
            'def f(x: set[int]) -> int:\n    """S.\n\n    Args:\n        x: X.\n    """',
            ["unsupported type hint", "set[int]", "list[T]"],
        ),
        (
            'def f(x: dict[int, str]) -> int:\n    """S.\n\n    Args:\n        x: X.\n    """',
            ["dict keys must be str"],
        ),
        ('def f(x) -> int:\n    """S.\n\n    Args:\n        x: X.\n    """', ["no type hint"]),
        ('def f(*xs: int) -> int:\n    """S.\n\n    Args:\n        xs: X.\n    """', ["variadic"]),
        (
            'def f(**kw: int) -> int:\n    """S.\n\n    Args:\n        kw: X.\n    """',
            ["variadic", "named parameters"],
        ),
    ],
)
def test_bad_definitions_raise_clear_errors(fn_source: str, needles: list[str]) -> None:
    namespace: dict[str, object] = {}
    exec(fn_source, namespace)
    with pytest.raises(ToolError) as info:
        tool(namespace["f"])  # type: ignore[arg-type]
    message = str(info.value)
    assert "@tool" in message
    for needle in needles:
        assert needle in message


def test_bad_options_raise_clear_errors() -> None:
    def f() -> str:
        """F."""
        return ""

    with pytest.raises(ToolError, match="tool name 'bad name'"):
        tool(name="bad name")(f)
    with pytest.raises(ToolError, match="timeout_s=0"):
        tool(timeout_s=0)(f)
    with pytest.raises(ToolError, match="finite deadline"):
        tool(timeout_s=float("inf"))(f)
    with pytest.raises(ToolError, match="max_concurrency=0"):
        tool(max_concurrency=0)(f)
    with pytest.raises(ToolError, match="rate_limit_per_s=-1"):
        tool(rate_limit_per_s=-1)(f)
    with pytest.raises(ToolError, match=r"@tool\(name='f'\)"):
        tool("f")  # type: ignore[call-overload]
    with pytest.raises(ToolError, match="already a Tool"):
        tool(weather)


def test_unresolvable_hint_names_the_fix() -> None:
    namespace: dict[str, object] = {}
    exec(
        "from __future__ import annotations\n"
        'def f(x: Missing) -> int:\n    """S.\n\n    Args:\n        x: X.\n    """',
        namespace,
    )
    with pytest.raises(ToolError, match=r"cannot be resolved.*module level"):
        tool(namespace["f"])  # type: ignore[arg-type]


# --- argument validation -------------------------------------------------------------------


def test_lax_coercion() -> None:
    kwargs = lookup_impl.bind_arguments(
        {"keys": ["a"], "weights": {"a": 1}, "mode": "fast", "level": "2", "flag": "true"}
    )
    assert kwargs["weights"] == {"a": 1.0} and isinstance(kwargs["weights"]["a"], float)
    assert kwargs["level"] is Level.HIGH
    assert kwargs["flag"] is True
    assert kwargs["limit"] is None and kwargs["scale"] == 1.5
    assert weather.bind_arguments({"city": "Rome", "unit": "fahrenheit", "days": "4"}) == {
        "city": "Rome",
        "unit": Unit.FAHRENHEIT,
        "days": 4,
    }


def test_validation_message_names_each_bad_field_and_expected_type() -> None:
    with pytest.raises(ToolError) as info:
        lookup_impl.bind_arguments(
            {"keys": ["a", 3], "weights": {"a": "x"}, "mode": "slow", "level": 1, "bogus": 1}
        )
    message = str(info.value)
    assert message.startswith("invalid arguments for tool 'lookup':")
    assert "'keys'[1]: Input should be a valid string (got 3; expected array of string)" in message
    assert "'weights'['a']:" in message and "expected object with number values" in message
    assert "'mode':" in message and 'expected one of "fast", "exact"' in message
    assert "'bogus': unexpected argument" in message
    assert "'level'" not in message  # valid
    assert "Expected: lookup(keys: array of string" in message


def test_missing_argument_message() -> None:
    with pytest.raises(ToolError) as info:
        weather.bind_arguments({})
    assert "'city': missing required argument (expected string)" in str(info.value)
    assert (
        'Expected: weather(city: string, unit: one of "celsius", "fahrenheit" = "celsius"'
        in str(info.value)
    )


def test_parameters_named_like_pydantic_attributes() -> None:
    @tool
    def odd(json: str, schema: int, model_config: bool = False) -> str:
        """Odd names.

        Args:
            json: J.
            schema: S.
            model_config: M.
        """
        return f"{json}{schema}{model_config}"

    assert odd.bind_arguments({"json": "a", "schema": "2"}) == {
        "json": "a",
        "schema": 2,
        "model_config": False,
    }


def test_module_level_tools_pickle_by_reference() -> None:
    assert pickle.loads(pickle.dumps(weather)) is weather


def _shout(text: str) -> str:
    """Shout.

    Args:
        text: Text.
    """
    return text.upper()


shout = tool(name="shout", timeout_s=2.0, max_concurrency=2)(_shout)


def test_other_tools_pickle_by_rebuilding() -> None:
    copy = pickle.loads(pickle.dumps(shout))
    assert copy is not shout
    assert (copy.name, copy.timeout_s, copy.max_concurrency) == ("shout", 2.0, 2)
    assert copy.schema == shout.schema
    assert copy("hi") == "HI"
