"""Type hints + Google docstring → a function's JSON schema and its pydantic argument validator."""

from __future__ import annotations

import enum
import functools
import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

import docstring_parser
import pydantic

from agentloop.errors import ToolError
from agentloop.tools.context import ToolContext

__all__ = [
    "FunctionSpec",
    "bind_arguments",
    "describe_schema",
    "hint_schema",
    "inspect_function",
    "signature_text",
]

SUPPORTED_HINTS = (
    "str, int, float, bool, list[T], dict[str, T], Literal[...], an Enum subclass, "
    "a union such as T | None, or ToolContext (injected, not part of the schema)"
)
_SCALARS: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_NONE_TYPE = type(None)


class _Unsupported(Exception):
    """A type hint the schema builder cannot express; the message names the hint."""


@dataclass(frozen=True)
class FunctionSpec:
    """What ``@tool`` learns from a function: its description, JSON schema and validator."""

    description: str
    parameters: dict[str, Any]
    arguments_model: type[pydantic.BaseModel]
    context_param: str | None


def hint_schema(hint: Any) -> dict[str, Any]:
    """The JSON schema of one supported type hint (enums inline, never ``$ref``)."""
    if isinstance(hint, type) and hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if hint is list:
        return {"type": "array"}
    if hint is dict:
        return {"type": "object"}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_schema([member.value for member in hint], repr(hint.__name__))
    origin, args = get_origin(hint), get_args(hint)
    if origin is list and len(args) == 1:
        return {"type": "array", "items": hint_schema(args[0])}
    if origin is dict and len(args) == 2:
        if args[0] is not str:
            raise _Unsupported(f"dict keys must be str (JSON object keys), got {hint!r}")
        return {"type": "object", "additionalProperties": hint_schema(args[1])}
    if origin is Literal:
        return _enum_schema(list(args), repr(hint))
    if origin is Union or origin is types.UnionType:
        members = [a for a in args if a is not _NONE_TYPE]
        if len(members) == 1:
            return _nullable(hint_schema(members[0]))
        schemas = [hint_schema(a) for a in members]
        if len(members) < len(args):
            schemas.append({"type": "null"})
        return {"anyOf": schemas}
    raise _Unsupported(f"unsupported type hint {hint!r}")


def _enum_schema(values: list[Any], where: str) -> dict[str, Any]:
    for value in values:
        if value is not None and not isinstance(value, str | int | float | bool):
            raise _Unsupported(f"{where} has a value {value!r} that is not a JSON scalar")
    kinds = {_SCALARS.get(type(v), "null") for v in values}
    schema: dict[str, Any] = {"enum": values}
    if len(kinds) == 1:
        schema = {"type": kinds.pop(), "enum": values}
    return schema


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    if isinstance(kind, str) and set(schema) <= {"type", "enum"}:
        out: dict[str, Any] = {"type": [kind, "null"]}
        if "enum" in schema:
            out["enum"] = [*schema["enum"], None]
        return out
    return {"anyOf": [schema, {"type": "null"}]}


def describe_schema(schema: Mapping[str, Any]) -> str:
    """A short human reading of a schema for error messages: ``array of integer``."""
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(describe_schema(s) for s in schema["anyOf"])
    kind = schema.get("type", "any value")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array" and "items" in schema:
        return f"array of {describe_schema(schema['items'])}"
    if kind == "object" and "additionalProperties" in schema:
        return f"object with {describe_schema(schema['additionalProperties'])} values"
    return str(kind)


def _is_optional(hint: Any) -> bool:
    return get_origin(hint) in (Union, types.UnionType) and _NONE_TYPE in get_args(hint)


def _json_default(value: Any) -> tuple[bool, Any]:
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False, None
    return True, value


def _fail(fn_name: str, problem: str, fix: str) -> ToolError:
    return ToolError(f"@tool {fn_name}: {problem}; {fix}")


def _docstring(fn: Callable[..., Any], fn_name: str) -> docstring_parser.Docstring:
    doc = inspect.getdoc(fn)
    if not doc or not doc.strip():
        raise _fail(
            fn_name,
            "the function has no docstring, so the model would not know what it does",
            "add a Google-style docstring: a one-line summary, then an 'Args:' section with one "
            "'name: description' line per parameter",
        )
    return docstring_parser.parse(doc, style=docstring_parser.DocstringStyle.GOOGLE)


def _type_hints(fn: Callable[..., Any], fn_name: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception as e:  # NameError for a hint string that cannot be resolved, mostly
        raise _fail(
            fn_name,
            f"its type hints cannot be resolved ({type(e).__name__}: {e})",
            "define the types used in the hints at module level (not inside a function)",
        ) from None


def inspect_function(fn: Callable[..., Any], fn_name: str) -> FunctionSpec:
    """Build the schema and validator of ``fn``; raise ``ToolError`` naming the fix if it cannot."""
    doc = _docstring(fn, fn_name)
    hints = _type_hints(fn, fn_name)
    arg_docs = {p.arg_name: " ".join((p.description or "").split()) for p in doc.params}
    properties: dict[str, Any] = {}
    required: list[str] = []
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for param in inspect.signature(fn).parameters.values():
        hint = _param_hint(param, hints, fn_name)
        if isinstance(hint, type) and issubclass(hint, ToolContext):
            context_param = param.name
            continue
        schema, default = _param_schema(param, hint, arg_docs, fn_name)
        if default is param.empty:
            required.append(param.name)
        properties[param.name] = schema
        # Field names are p0, p1, … with the parameter name as alias, so that parameters called
        # like BaseModel attributes (json, schema, model_*) cannot clash with pydantic.
        fields[f"p{len(fields)}"] = (
            hint,
            pydantic.Field(default=... if default is param.empty else default, alias=param.name),
        )
    stale = sorted(set(arg_docs) - set(properties) - {context_param})
    if stale:
        raise _fail(
            fn_name,
            f"the docstring describes {stale} but the function has no such parameter",
            "remove or rename those 'Args:' entries",
        )
    model = pydantic.create_model(
        f"{fn_name.rsplit('.', 1)[-1]}_arguments",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **fields,
    )
    parameters = {"type": "object", "properties": properties, "required": required}
    return FunctionSpec((doc.description or "").strip(), parameters, model, context_param)


def _param_hint(param: inspect.Parameter, hints: Mapping[str, Any], fn_name: str) -> Any:
    if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
        raise _fail(
            fn_name,
            f"parameter {str(param)!r} is variadic or positional-only",
            "use plain named parameters; a tool is called with keyword arguments from JSON",
        )
    if param.name not in hints:
        raise _fail(
            fn_name, f"parameter {param.name!r} has no type hint", f"use one of {SUPPORTED_HINTS}"
        )
    return hints[param.name]


def _param_schema(
    param: inspect.Parameter, hint: Any, arg_docs: Mapping[str, str], fn_name: str
) -> tuple[dict[str, Any], Any]:
    """The parameter's schema (description and default included) and its effective default."""
    try:
        schema = hint_schema(hint)
    except _Unsupported as e:
        raise _fail(
            fn_name, f"parameter {param.name!r}: {e}", f"use one of {SUPPORTED_HINTS}"
        ) from None
    if not arg_docs.get(param.name):
        raise _fail(
            fn_name,
            f"parameter {param.name!r} is not described in the docstring",
            f"add '{param.name}: <what it is>' under 'Args:'",
        )
    schema["description"] = arg_docs[param.name]
    default = param.default
    if default is param.empty and _is_optional(hint):
        default = None  # `x: T | None` without a default is optional, defaulting to None
    if default is not param.empty:
        ok, value = _json_default(default)
        if ok:
            schema["default"] = value
    return schema, default


def bind_arguments(
    tool_name: str,
    model: type[pydantic.BaseModel],
    parameters: Mapping[str, Any],
    arguments: Mapping[str, Any],
) -> dict[str, Any]:
    """Validate and coerce (lax) ``arguments``; return keyword arguments for the function.

    Raises ``ToolError`` with one line per bad argument and the expected signature.
    """
    try:
        validated = model.model_validate(dict(arguments))
    except pydantic.ValidationError as e:
        raise ToolError(_validation_message(tool_name, e, parameters, arguments)) from None
    return {key: getattr(validated, name) for name, key in _argument_keys(model)}


@functools.lru_cache(maxsize=256)
def _argument_keys(model: type[pydantic.BaseModel]) -> tuple[tuple[str, str], ...]:
    """(field name, argument name) per field; looked up once per model, not on every call."""
    return tuple((name, info.alias or name) for name, info in model.model_fields.items())


def _validation_message(
    tool_name: str,
    error: pydantic.ValidationError,
    parameters: Mapping[str, Any],
    arguments: Mapping[str, Any],
) -> str:
    properties: Mapping[str, Any] = parameters.get("properties", {})
    lines: dict[str, str] = {}  # one line per argument: the first error pydantic reports for it
    for item in error.errors(include_url=False):
        loc = item["loc"]
        arg = str(loc[0]) if loc else "arguments"
        if arg in lines:
            continue
        expected = describe_schema(properties[arg]) if arg in properties else None
        if item["type"] == "missing":
            lines[arg] = f"{arg!r}: missing required argument (expected {expected})"
        elif item["type"] == "extra_forbidden":
            lines[arg] = f"{arg!r}: unexpected argument; this tool has no parameter {arg!r}"
        else:
            where = _item_path(arguments.get(arg), loc[1:])
            got = repr(item.get("input"))
            got = got if len(got) <= 60 else got[:57] + "..."
            lines[arg] = f"{arg!r}{where}: {item['msg']} (got {got}; expected {expected})"
    body = "\n".join(f"  - {line}" for line in lines.values())
    return (
        f"invalid arguments for tool {tool_name!r}:\n{body}\n"
        f"Expected: {signature_text(tool_name, parameters)}"
    )


def _item_path(value: Any, loc: tuple[int | str, ...]) -> str:
    """``[2]['k']`` for the part of ``loc`` that indexes into the value (pydantic also puts union
    member tags like ``'int'`` into locations; those are skipped)."""
    path = ""
    for part in loc:
        in_dict = isinstance(value, Mapping) and part in value
        in_list = isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value)
        if not (in_dict or in_list):
            continue
        value = value[part]
        path += f"[{part!r}]"
    return path


def signature_text(tool_name: str, parameters: Mapping[str, Any]) -> str:
    """``name(a: integer, b: string = "x")`` for error messages."""
    parts = []
    for name, schema in parameters.get("properties", {}).items():
        part = f"{name}: {describe_schema(schema)}"
        if "default" in schema:
            part += f" = {json.dumps(schema['default'])}"
        elif name not in parameters.get("required", ()):
            part += " (optional)"
        parts.append(part)
    return f"{tool_name}({', '.join(parts)})"
