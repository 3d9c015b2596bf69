"""The ``@tool`` decorator and the frozen ``Tool`` it returns (schema, validation, limits)."""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, overload

import pydantic

from agentloop.errors import ToolError
from agentloop.tools.runtime import ToolLimiter, shared_limiter
from agentloop.tools.schema import bind_arguments, inspect_function, signature_text
from agentloop.tools.tape_file import schema_sha256

__all__ = ["Tool", "tool"]

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, eq=False)
class Tool:
    """A function the model can call, with its OpenAI-style schema and per-tool limits.

    Build one with ``@tool``. Calling the ``Tool`` calls the function unchanged (handy in tests);
    the dispatcher instead validates JSON arguments with ``bind_arguments`` first.

    ``max_concurrency`` and ``rate_limit_per_s`` hold for the tool's *name* across every session
    and episode, and every ``Tool`` of that name and limits (tools rebuilt per env instance share
    them): the rate for the whole process, the concurrency per event loop (asyncio primitives
    bind to one loop; eval and training run every episode on one). A call abandoned at its
    deadline keeps its slot until it ends.
    ``preflight`` (optional) checks the services the tool needs once, before the first episode
    (``Env.preflight``): e.g. the code interpreter starts its sandbox, whose servers are checked.
    ``context_param`` names the parameter that receives the episode's
    ``ToolContext`` (``None`` if the function takes none).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    timeout_s: float = 30.0
    max_concurrency: int | None = None
    rate_limit_per_s: float | None = None
    context_param: str | None = None
    arguments_model: type[pydantic.BaseModel] | None = field(default=None, repr=False)
    preflight: Callable[[], Awaitable[None]] | None = field(default=None, repr=False)
    limiter: ToolLimiter = field(init=False, repr=False)
    _is_async: bool = field(init=False, repr=False)  # asked on every call: inspect once

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ToolError(
                f"tool name {self.name!r} is invalid; use 1-64 letters, digits, '_' or '-' "
                "(pass @tool(name=...) to choose another)"
            )
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ToolError(f"tool {self.name!r}: timeout_s={timeout!r}; use a number > 0")
        if not math.isfinite(timeout):
            raise ToolError(
                f"tool {self.name!r}: timeout_s={timeout!r}; every tool needs a finite deadline"
            )
        object.__setattr__(self, "timeout_s", float(timeout))
        limit = self.max_concurrency
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise ToolError(
                f"tool {self.name!r}: max_concurrency={limit!r}; use an int >= 1 or None (no limit)"
            )
        rate = self.rate_limit_per_s
        if rate is not None and (
            isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < math.inf
        ):
            raise ToolError(
                f"tool {self.name!r}: rate_limit_per_s={rate!r}; use a number > 0 "
                "or None (no limit)"
            )
        object.__setattr__(self, "limiter", shared_limiter(self.name, limit, rate))
        object.__setattr__(self, "_is_async", inspect.iscoroutinefunction(self.fn))

    @property
    def is_async(self) -> bool:
        return self._is_async

    @property
    def schema(self) -> dict[str, Any]:
        """``{"type": "function", "function": {"name", "description", "parameters"}}`` (a copy)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(self.parameters),
            },
        }

    @functools.cached_property
    def schema_sha256(self) -> str:
        """The SHA-256 of :attr:`schema` (canonical JSON): a tape records it beside each call."""
        return schema_sha256(self.schema)

    @property
    def origin(self) -> str:
        """Where the tool comes from, for messages: the function's module and name."""
        module = getattr(self.fn, "__module__", None) or "?"
        return f"{module}.{getattr(self.fn, '__qualname__', self.name)}"

    @property
    def signature(self) -> str:
        """``name(a: integer, b: string = "x")``, as shown to the model in argument errors."""
        return signature_text(self.name, self.parameters)

    def bind_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Validate and coerce the model's JSON arguments into keyword arguments for ``fn``.

        Raises ``ToolError`` naming each bad argument and what was expected. The ``ToolContext``
        parameter is not included; the dispatcher adds it.
        """
        if self.arguments_model is None:
            return dict(arguments)
        return bind_arguments(self.name, self.arguments_model, self.parameters, arguments)

    async def bind_arguments_async(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """What the dispatcher awaits: :meth:`bind_arguments`, here on the loop (a pydantic check
        is linear-time). A tool whose check may take long (an MCP server's schema) runs it off the
        loop under a deadline, and raises ``DeadlineExceeded`` past it."""
        return self.bind_arguments(arguments)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle (Ray, multiprocessing) by reference when the tool is a module global (the usual
        # @tool case: the module attribute is this Tool, so its fn cannot be pickled by name);
        # otherwise rebuild it from the function and the options.
        module = getattr(self.fn, "__module__", None)
        qualname = getattr(self.fn, "__qualname__", "")
        if module and "<locals>" not in qualname and _lookup(module, qualname) is self:
            return (_lookup, (module, qualname))
        options = (self.name, self.timeout_s, self.max_concurrency, self.rate_limit_per_s)
        return (_make_tool, (self.fn, *options))


def _lookup(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _make_tool(
    fn: Callable[..., Any],
    name: str | None,
    timeout_s: float,
    max_concurrency: int | None,
    rate_limit_per_s: float | None,
) -> Tool:
    if isinstance(fn, Tool):
        raise ToolError(f"{fn.name!r} is already a Tool; apply @tool once")
    if not callable(fn):
        raise ToolError(
            f"@tool expects a function, got {fn!r}; to set the name write @tool(name={fn!r})"
        )
    fn_name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    spec = inspect_function(fn, fn_name)
    return Tool(
        name=name if name is not None else getattr(fn, "__name__", ""),
        description=spec.description,
        parameters=spec.parameters,
        fn=fn,
        timeout_s=timeout_s,
        max_concurrency=max_concurrency,
        rate_limit_per_s=rate_limit_per_s,
        context_param=spec.context_param,
        arguments_model=spec.arguments_model,
    )


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    timeout_s: float = 30.0,
    max_concurrency: int | None = None,
    rate_limit_per_s: float | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    timeout_s: float = 30.0,
    max_concurrency: int | None = None,
    rate_limit_per_s: float | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a sync or async function into a ``Tool``; use as ``@tool`` or ``@tool(...)``.

    The schema comes from the type hints and a Google-style docstring: the summary (and any
    further description) describes the tool, each ``Args:`` entry describes a parameter. Supported
    hints: str, int, float, bool, ``list[T]``, ``dict[str, T]``, ``Literal[...]`` and Enum
    subclasses (inline ``enum``), unions such as ``T | None`` (a ``T | None`` parameter without a
    default defaults to None). Parameters with defaults are not required. A parameter annotated
    ``ToolContext`` receives the episode's context and is left out of the schema.

    Args:
        fn: The function (when used as a bare ``@tool``).
        name: Tool name shown to the model (default: the function's name).
        timeout_s: Deadline of one call; a call past it becomes a ``timeout`` error result.
        max_concurrency: At most this many calls of this tool run at once (all episodes).
        rate_limit_per_s: Calls of this tool start at most this often per second (all episodes).
    """

    def decorate(f: Callable[..., Any]) -> Tool:
        return _make_tool(f, name, timeout_s, max_concurrency, rate_limit_per_s)

    if fn is None:
        return decorate
    return decorate(fn)
