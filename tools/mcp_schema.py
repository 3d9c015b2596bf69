"""An MCP tool's arguments checked against its server's input schema, in bounded time, off the loop.

The schema comes from a third-party server and the strings from the policy, so a ``pattern``
with nested alternation (``^(a|aa)+$``) must not run on Python's backtracking ``re``: its
matcher holds the GIL, so even on another thread it freezes the event loop (a 38-character
argument: 9.6 s). Here ``pattern``, ``patternProperties`` and the pattern part of
``additionalProperties`` match with the ``regex`` module, which releases the GIL while it
matches and takes a ``timeout``: every match gets what is left of the check's deadline, and one
past it raises :class:`~agentloop.tools.runtime.DeadlineExceeded`. The rest of ``jsonschema``'s
keywords are unchanged (they are pure Python: on a thread they yield the GIL every few ms).
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import Iterator, Mapping
from typing import Any

from agentloop.tools.runtime import DeadlineExceeded

__all__ = ["SchemaCheck", "matching"]

_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar("mcp_schema_deadline")
_WATCH: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("mcp_schema_watch")


class SchemaCheck:
    """A server's input schema, ready to check arguments against (``None`` from :meth:`of`
    when the schema itself is broken: the server then judges the arguments)."""

    def __init__(self, validator: Any, timeout_s: float) -> None:
        self._validator = validator
        self.timeout_s = timeout_s

    @classmethod
    def of(cls, schema: Mapping[str, Any], timeout_s: float) -> SchemaCheck | None:
        import jsonschema  # type: ignore[import-untyped]  # no stubs installed

        base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            base.check_schema(schema)
        except jsonschema.SchemaError:
            return None
        return cls(_bounded(base)(schema), timeout_s)

    def first_error(self, instance: Any, watch: list[str] | None = None) -> Any | None:
        """The most relevant ``jsonschema.ValidationError`` of ``instance``, or None; raises
        ``DeadlineExceeded`` when a pattern match runs past ``timeout_s``. ``watch`` (if given)
        holds what is being matched now, for a caller that gives up waiting first."""
        import jsonschema

        token = _DEADLINE.set(time.monotonic() + self.timeout_s)
        watching = _WATCH.set(watch)
        try:
            return jsonschema.exceptions.best_match(self._validator.iter_errors(instance))
        finally:
            _WATCH.reset(watching)
            _DEADLINE.reset(token)


def matching(pattern: str, text: str) -> str:
    return f"matching {len(text)} characters against the server's pattern {pattern!r}"


def _search(pattern: str, text: str) -> bool:
    import regex

    left = _DEADLINE.get(time.monotonic() + 30.0) - time.monotonic()
    watch = _WATCH.get(None)
    if watch is not None:
        watch[:] = [matching(pattern, text)]
    try:
        if left <= 0:
            raise TimeoutError
        return regex.search(pattern, text, timeout=left) is not None
    except TimeoutError:
        raise DeadlineExceeded(f"{matching(pattern, text)} ran past the deadline") from None
    except regex.error:
        return True  # a pattern the engine cannot read: the server judges the value


@functools.cache
def _bounded(base: type[Any]) -> type[Any]:
    """``base`` (a jsonschema validator class) with every regex match bounded (module doc)."""
    from jsonschema import ValidationError, validators

    original_additional = base.VALIDATORS.get("additionalProperties")

    def pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[Any]:
        if validator.is_type(instance, "string") and not _search(patrn, instance):
            yield ValidationError(f"{instance!r} does not match {patrn!r}")

    def pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Any:
        if not validator.is_type(instance, "object"):
            return
        for patrn, subschema in patterns.items():
            for key, value in instance.items():
                if _search(patrn, key):
                    yield from validator.descend(value, subschema, path=key, schema_path=patrn)

    def additional_properties(validator: Any, ap: Any, instance: Any, schema: Any) -> Any:
        patterns = schema.get("patternProperties") or {}
        if not patterns or not validator.is_type(instance, "object"):
            if original_additional is not None:
                yield from original_additional(validator, ap, instance, schema)
            return
        known = schema.get("properties", {})
        extras = sorted(
            (k for k in instance if k not in known and not any(_search(p, k) for p in patterns)),
            key=str,
        )
        if validator.is_type(ap, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], ap, path=extra)
        elif not ap and extras:
            joined = ", ".join(repr(e) for e in extras)
            regexes = ", ".join(repr(p) for p in sorted(patterns))
            yield ValidationError(f"{joined} do not match any of the regexes: {regexes}")

    bounded: type[Any] = validators.extend(
        base,
        {
            "pattern": pattern,
            "patternProperties": pattern_properties,
            "additionalProperties": additional_properties,
        },
    )
    return bounded
