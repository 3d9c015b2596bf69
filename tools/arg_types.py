"""Tool-call values of untyped wire forms (GLM-4.5, Qwen3-Coder XML) typed by the tool's schema."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["NO_TOOLS", "ToolSchemas", "coerce_value"]


@dataclass(frozen=True)
class ToolSchemas:
    """The JSON schemas of the parameters of the tools a model was shown, by tool name.

    A parser of a format that writes every value as bare text (``<arg_value>42</arg_value>``)
    types each value by its parameter's schema, as vLLM's parsers do: ``42`` is the string
    ``"42"`` for a ``string`` parameter and the integer 42 for an ``integer`` one. A value of a
    tool or parameter the schemas do not name stays a string. Formats whose wire form is JSON
    keep the types the model wrote.
    """

    properties: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    """tool name → its ``parameters`` schema's ``properties`` (parameter → JSON schema)."""

    @classmethod
    def of(cls, tools: Sequence[Mapping[str, Any]] | None) -> ToolSchemas:
        """From OpenAI-style tool schemas (``{"type": "function", "function": {...}}`` or the
        bare ``{"name": ..., "parameters": ...}``), as a chat template renders them."""
        found: dict[str, Mapping[str, Any]] = {}
        for tool in tools or ():
            spec = tool.get("function", tool)
            if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
                continue
            params = spec.get("parameters")
            props = params.get("properties") if isinstance(params, Mapping) else None
            props = props if isinstance(props, Mapping) else {}
            found[spec["name"]] = MappingProxyType(dict(props))
        return cls(MappingProxyType(found))

    def typed(self, tool: str, raw: Mapping[str, str]) -> dict[str, Any]:
        """``raw`` (parameter → the text the model wrote) with each value typed by its schema."""
        props = self.properties.get(tool, {})
        return {
            key: coerce_value(text, props[key]) if isinstance(props.get(key), Mapping) else text
            for key, text in raw.items()
        }


NO_TOOLS = ToolSchemas()
"""No schemas: every value of an untyped wire form stays the string the model wrote."""

_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum"), "string"),
    **dict.fromkeys(
        ("int", "int32", "int64", "uint", "uint32", "uint64", "long", "short", "unsigned"),
        "integer",
    ),
    **dict.fromkeys(("float", "float32", "float64", "double"), "number"),
    "bool": "boolean",
    "dict": "object",
    **dict.fromkeys(("arr", "list", "sequence"), "array"),
}


def _type_of(value: Any) -> str:
    """The JSON type name of an ``enum`` value."""
    if value is None:
        return "null"
    if isinstance(value, bool):  # before int: a bool is an int
        return "boolean"
    for cls, name in ((int, "integer"), (float, "number"), (list, "array"), (dict, "object")):
        if isinstance(value, cls):
            return name
    return "string"


def _schema_types(schema: Any) -> set[str]:
    """The JSON types a schema allows: ``type``, the types of ``enum`` values, and those of
    ``anyOf``/``oneOf``/``allOf`` branches; ``{"string"}`` when it says nothing."""
    if not isinstance(schema, Mapping):
        return {"string"}
    kinds = schema.get("type")
    listed = kinds if isinstance(kinds, list) else [kinds]
    found = {k for k in listed if isinstance(k, str)}
    enum = schema.get("enum")
    if isinstance(enum, list):
        found.update(_type_of(v) for v in enum)
    for branch in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(branch), list):
            for sub in schema[branch]:
                found |= _schema_types(sub)
    return {_ALIASES.get(k.strip().lower(), k.strip().lower()) for k in found} or {"string"}


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def _json(text: str) -> tuple[bool, Any]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False, None
    return _finite(value), value


def coerce_value(text: str, schema: Any) -> Any:
    """``text`` as the first type its schema allows that it reads as, in the order null,
    integer, number, boolean, object, array, string; else as JSON if it parses, else the text.

    vLLM's rules (``coerce_to_schema_type``): a number that is integral is an ``int``
    (``"3.0"`` → 3), a boolean reads ``true``/``false``/``1``/``0`` in any case, and a JSON
    value that is not finite (``1e999``) stays text.
    """
    kinds = _schema_types(schema)
    for kind in ("null", "integer", "number", "boolean", "object", "array", "string"):
        if kind not in kinds:
            continue
        if kind == "string":
            return text
        if kind == "null" and text.lower() == "null":
            return None
        if kind == "integer":
            try:
                return int(text)
            except ValueError:
                continue
        if kind == "number":
            try:
                number = float(text)
            except ValueError:
                continue
            if math.isfinite(number):
                return int(number) if number == int(number) else number
        if kind == "boolean" and text.strip().lower() in ("true", "1", "false", "0"):
            return text.strip().lower() in ("true", "1")
        if kind in ("object", "array"):
            ok, value = _json(text)
            if ok:
                return value
    ok, value = _json(text)
    return value if ok else text
