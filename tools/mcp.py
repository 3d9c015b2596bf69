"""MCP servers as tools: a server's tools as agentloop ``Tool``s, one client session per episode.

Point :func:`mcp_tools` at a server — a command run over stdio, or a streamable HTTP URL — and
get one ``Tool`` per server tool, with the server's name, description and input JSON schema.
Each episode opens its own MCP client session on its first call (through the episode's
``ToolContext``, so it is closed with the episode's tool session on every exit path); for a
stdio server that is its own server process. Failures are observations, as for any tool: a
server that does not start, dies, returns an error or hangs past ``timeout_s`` gives the model
an ``Error: …`` message (``tool_exception`` or ``timeout``), never a crash or a hang.

The tools of one server spec are made once per process and shared (so ``max_concurrency`` and
``rate_limit_per_s`` hold across every episode). Listing them connects to the server once.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import json
import logging
import os
import shlex
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from agentloop.errors import ConfigError, ToolError, did_you_mean
from agentloop.tools.context import ToolContext
from agentloop.tools.mcp_schema import SchemaCheck
from agentloop.tools.runtime import CANCEL_GRACE_S, DeadlineExceeded, call_with_deadline
from agentloop.tools.tool import Tool
from agentloop.tools.toolset import ToolOutput

__all__ = [
    "MCPServerSpec",
    "MCPTool",
    "MCPToolSchema",
    "list_mcp_tools",
    "mcp_tools",
    "mcp_tools_from_schemas",
    "parse_tool_spec",
]

log = logging.getLogger(__name__)
_CONTEXT_PARAM = "_agentloop_mcp_context"  # cannot clash with a JSON-schema property we pass on
_PREFIX = "mcp:"
_LIMITS = (  # (field, type, fix) of MCPServerSpec's numbers, all > 0
    ("timeout_s", int | float, "a number of seconds > 0"),
    ("startup_timeout_s", int | float, "a number of seconds > 0"),
    ("max_concurrency", int, "an integer >= 1 (unset: no limit)"),
    ("rate_limit_per_s", int | float, "a number > 0 (unset: no limit)"),
)


@dataclass(frozen=True)
class MCPServerSpec:
    """How to reach an MCP server and what limits its tools get.

    Exactly one of ``command`` (stdio: the server is started per episode as this process) and
    ``url`` (streamable HTTP, e.g. ``http://127.0.0.1:8000/mcp``) is set. ``parse`` reads a
    URL or a command line; :func:`parse_tool_spec` reads ``--tools``/``data.tools``, options too.
    """

    command: tuple[str, ...] = ()
    """stdio server: program and arguments."""
    url: str | None = None
    """Streamable HTTP server URL."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables of a stdio server (added to this process's)."""
    timeout_s: float = 30.0
    """Deadline of one call (a call past it is a ``timeout`` error observation)."""
    startup_timeout_s: float = 30.0
    """Deadline for connecting (and, for stdio, starting the server) on an episode's first
    call, on top of ``timeout_s``."""
    max_concurrency: int | None = None
    """Each tool of the server: at most this many calls at once, across episodes."""
    rate_limit_per_s: float | None = None
    """Each tool of the server: calls start at most this often per second, across episodes."""
    include: tuple[str, ...] | None = None
    """Only these tools of the server (None: all)."""
    replace: tuple[str, ...] = ()
    """Tools of the server that may take the place of an env's tool of the same name (e.g.
    ``python``: the model's code then runs in that server, not in agentloop's sandbox); any
    other name clash is a ``ConfigError``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "env", tuple((str(k), str(v)) for k, v in dict(self.env).items()))
        if self.include is not None:
            object.__setattr__(self, "include", tuple(self.include))
        object.__setattr__(self, "replace", tuple(self.replace))
        if bool(self.command) == bool(self.url):
            raise ConfigError(
                f"an MCP server needs a command (stdio) or a url (HTTP), not "
                f"{'both' if self.command else 'neither'}: e.g. "
                "MCPServerSpec(command=('python', 'server.py')) or "
                "MCPServerSpec(url='http://127.0.0.1:8000/mcp')"
            )
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"MCP server url {self.url!r} must start with http:// or https://")
        for name, kind, fix in _LIMITS:
            value = getattr(self, name)
            if value is None and name in ("max_concurrency", "rate_limit_per_s"):
                continue  # no limit
            if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
                raise ConfigError(f"MCP server {name}={value!r}; use {fix}")

    @classmethod
    def parse(cls, spec: str, **options: Any) -> MCPServerSpec:
        """``http(s)://…`` is a URL; anything else is a shell-quoted stdio command line."""
        text = spec.strip()
        if text.startswith(("http://", "https://")):
            return cls(url=text, **options)
        command = tuple(shlex.split(text))
        if not command:
            raise ConfigError(
                f"MCP server spec {spec!r} is empty; give a command ('python server.py') or a URL"
            )
        return cls(command=command, **options)

    @property
    def label(self) -> str:
        return self.url or shlex.join(self.command)


#: The options of ``mcp[KEY=VALUE,…]:SERVER``: each reads its value from the text after ``=``.
_OPTIONS: dict[str, Callable[[str], Any]] = {
    "max_concurrency": int,
    "rate_limit_per_s": float,
    "timeout_s": float,
    "startup_timeout_s": float,
    "include": lambda text: tuple(text.split("+")),
    "replace": lambda text: tuple(text.split("+")),
}
_EXAMPLE = "e.g. 'mcp[max_concurrency=2,timeout_s=10,include=add+python]:python server.py'"


def parse_tool_spec(spec: str) -> MCPServerSpec:
    """A ``--tools`` (or ``data.tools``) value: ``mcp:COMMAND ARGS…`` or ``mcp:http://…/mcp``,
    with options in brackets: ``mcp[max_concurrency=2,timeout_s=10]:COMMAND ARGS…``; the keys are
    ``MCPServerSpec``'s limits (``include`` and ``replace`` list tools joined by ``+``)."""
    if spec.startswith("mcp["):
        head, sep, server = spec[len("mcp[") :].partition("]:")
        try:
            if not sep:
                raise ConfigError(f"options open with 'mcp[' but no ']:' ends them; {_EXAMPLE}")
            return MCPServerSpec.parse(server, **_parse_options(head))
        except ConfigError as exc:
            raise ConfigError(f"tool spec {spec!r}: {exc}") from None
    if not spec.startswith(_PREFIX):
        raise ConfigError(
            f"tool spec {spec!r} is not understood; use 'mcp:COMMAND ARGS' (an MCP server over "
            f"stdio) or 'mcp:http://HOST:PORT/mcp' (streamable HTTP); with options: {_EXAMPLE}"
        )
    return MCPServerSpec.parse(spec[len(_PREFIX) :])


def _parse_options(text: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = (part.strip() for part in item.partition("="))
        if key not in _OPTIONS:
            raise ConfigError(f"unknown option {key!r}.{did_you_mean(key, _OPTIONS)} "
                              f"The options are {', '.join(_OPTIONS)}; {_EXAMPLE}")  # fmt: skip
        if not sep or not value or key in options:
            raise ConfigError(f"option {item!r} needs one value, once: {key}=VALUE; {_EXAMPLE}")
        try:
            options[key] = _OPTIONS[key](value)
        except ValueError:
            kind = "an integer" if _OPTIONS[key] is int else "a number"
            raise ConfigError(f"{key}={value!r} is not {kind}") from None
    return options


# ---------------------------------------------------------------------- connection
def _client(spec: MCPServerSpec) -> Any:
    from mcp import Client, StdioServerParameters

    if spec.url is not None:
        return Client(spec.url, mode="auto")
    program, *args = spec.command
    env = {**os.environ, **dict(spec.env)} if spec.env else None
    return Client(StdioServerParameters(command=program, args=args, env=env), mode="auto")


def _reason(exc: BaseException) -> str:
    """The first leaf of an (anyio) exception group, as ``Type: message``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@asynccontextmanager
async def connect(spec: MCPServerSpec) -> AsyncIterator[Any]:
    """An MCP ``Client`` session with the server, closed on exit (a stdio server stops).

    The SDK's session lives in task groups that must be entered and exited by one task, while
    an episode opens it in one tool call and closes it from the env: so an owner task holds
    it, and callers in any task of the loop use the client.
    """
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[Any] = loop.create_future()
    stop = asyncio.Event()

    async def own() -> None:
        try:
            async with _client(spec) as client:
                ready.set_result(client)
                await stop.wait()
        except BaseException as exc:  # the client's failure must reach the caller, not vanish
            if not ready.done():
                ready.set_exception(ToolError(f"MCP server {spec.label!r}: {_reason(exc)}"))
            elif not isinstance(exc, asyncio.CancelledError):
                log.debug("MCP session with %s ended with %s", spec.label, _reason(exc))

    owner = loop.create_task(own(), name=f"mcp-session {spec.label}")
    try:
        async with asyncio.timeout(spec.startup_timeout_s):
            client = await asyncio.shield(ready)
    except TimeoutError:
        await _stop_owner(owner, stop)
        raise ToolError(
            f"MCP server {spec.label!r} did not start within {spec.startup_timeout_s}s"
        ) from None
    except BaseException:
        await _stop_owner(owner, stop)
        raise
    try:
        yield client
    finally:
        await _stop_owner(owner, stop)


async def _stop_owner(owner: asyncio.Task[None], stop: asyncio.Event) -> None:
    stop.set()
    _, pending = await asyncio.wait({owner}, timeout=5.0)  # stdio: terminate, then kill
    if pending:
        owner.cancel()
        await asyncio.wait({owner}, timeout=CANCEL_GRACE_S)


# ---------------------------------------------------------------------- tools
@dataclass(frozen=True, eq=False)
class MCPTool(Tool):
    """A ``Tool`` calling one tool of an MCP server; arguments are checked against the
    server's input schema before the call (a mismatch is an ``invalid_arguments`` error).

    The check runs on a thread, its regex matches bounded by ``check_timeout_s`` (the server's
    ``timeout_s``): a schema whose ``pattern`` backtracks never stalls the event loop, and a
    check past its deadline is a ``timeout`` error observation (:mod:`agentloop.tools.mcp_schema`).
    """

    check_timeout_s: float = 30.0
    server: str = ""
    """The server's label (its URL or command line)."""

    @property
    def origin(self) -> str:
        return f"the MCP server {self.server!r}"

    @functools.cached_property
    def _check(self) -> SchemaCheck | None:
        return SchemaCheck.of(self.parameters, self.check_timeout_s)

    def bind_arguments(
        self, arguments: Mapping[str, Any], watch: list[str] | None = None
    ) -> dict[str, Any]:
        args = json.loads(json.dumps(dict(arguments), default=list))  # frozen → plain JSON
        check = self._check
        error = check.first_error(args, watch) if check is not None else None  # None: server's
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "arguments"
            raise ToolError(f"{self.signature}: {where}: {error.message}")
        return dict(args)

    async def bind_arguments_async(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        watch: list[str] = []  # what the check is matching, when the wait gives up
        try:
            bound: dict[str, Any] = await call_with_deadline(
                self.bind_arguments,
                {"arguments": arguments, "watch": watch},
                is_async=False,
                timeout_s=self.check_timeout_s,
                name=self.name,
            )
        except DeadlineExceeded:
            doing = f" ({watch[0]})" if watch else ""
            raise DeadlineExceeded(
                f"tool {self.name!r}: checking the arguments against the server's input schema "
                f"did not finish within {self.check_timeout_s}s (the tool's timeout_s){doing}; "
                "send a shorter or simpler value"
            ) from None
        return bound


def _session_key(spec: MCPServerSpec) -> str:
    return f"mcp.session.{spec.label}"


def _make_call(spec: MCPServerSpec, name: str) -> Any:
    async def call(**kwargs: Any) -> str | ToolOutput:
        ctx: ToolContext = kwargs.pop(_CONTEXT_PARAM)
        client = await ctx.enter(_session_key(spec), lambda: connect(spec))
        try:
            async with asyncio.timeout(spec.timeout_s):
                result = await client.call_tool(name, kwargs)
        except TimeoutError:
            raise DeadlineExceeded(f"tool {name!r} timed out after {spec.timeout_s}s") from None
        except Exception as exc:
            raise ToolError(
                f"the MCP server {spec.label!r} failed ({_reason(exc)}); it may have stopped"
            ) from exc
        if any(getattr(block, "type", None) == "image" for block in result.content):
            return await asyncio.to_thread(_render, result)  # decoding pixels: off the loop
        return _render(result)

    return call


def _render(result: Any) -> str | ToolOutput:
    """An MCP ``CallToolResult`` as observation text (and images); ``isError`` raises."""
    from mcp_types import EmbeddedResource, ImageContent, TextContent, TextResourceContents

    texts: list[str] = []
    images: list[Any] = []
    for block in result.content:
        if isinstance(block, TextContent):
            texts.append(block.text)
        elif isinstance(block, ImageContent):
            from PIL import Image

            image = Image.open(io.BytesIO(base64.b64decode(block.data)))
            image.load()
            images.append(image)
        elif isinstance(block, EmbeddedResource) and isinstance(
            block.resource, TextResourceContents
        ):
            texts.append(block.resource.text)
        else:
            texts.append(f"[{getattr(block, 'type', type(block).__name__)} content not shown]")
    if not texts and result.structured_content is not None:
        texts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(texts)
    if result.is_error:
        raise ToolError(text or "the server reported an error")
    return ToolOutput(text, tuple(images)) if images else text


async def list_mcp_tools(spec: MCPServerSpec) -> list[Tool]:
    """Connect to the server, list its tools and make a ``Tool`` of each (not cached)."""
    async with connect(spec) as client:
        listed = []
        cursor = None
        while True:
            page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
    by_name = {t.name: t for t in listed}
    names = spec.include if spec.include is not None else tuple(by_name)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ConfigError(
            f"MCP server {spec.label!r} has no tools {unknown}; it has {sorted(by_name)}"
        )
    schemas = [
        MCPToolSchema(n, by_name[n].description or "", dict(by_name[n].input_schema)) for n in names
    ]
    return mcp_tools_from_schemas(spec, schemas)


@dataclass(frozen=True)
class MCPToolSchema:
    """What a server declares of one tool: its name, description and input JSON schema."""

    name: str
    description: str
    input_schema: Mapping[str, Any]


def mcp_tools_from_schemas(spec: MCPServerSpec, schemas: Sequence[MCPToolSchema]) -> list[Tool]:
    """``Tool``s calling ``spec``'s server with the given (listed or recorded) schemas; nothing
    connects until a call runs."""
    return [
        MCPTool(
            name=s.name,
            description=s.description,
            parameters=dict(s.input_schema),
            fn=_make_call(spec, s.name),
            timeout_s=spec.timeout_s + spec.startup_timeout_s,  # the call's own deadline is inside
            max_concurrency=spec.max_concurrency,
            rate_limit_per_s=spec.rate_limit_per_s,
            context_param=_CONTEXT_PARAM,
            check_timeout_s=spec.timeout_s,
            server=spec.label,
        )
        for s in schemas
    ]


@functools.cache
def _cached_tools(spec: MCPServerSpec) -> tuple[Tool, ...]:
    # Listing is async; envs are built synchronously, maybe inside a running loop: run it on a
    # thread of its own (once per spec and process: the result is cached).
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(asyncio.run(list_mcp_tools(spec)))
        except BaseException as exc:
            box.append(exc)

    thread = threading.Thread(target=run, name="agentloop-mcp-list", daemon=True)
    thread.start()
    thread.join(spec.startup_timeout_s + spec.timeout_s)
    if not box:
        raise ConfigError(f"listing the tools of MCP server {spec.label!r} did not finish")
    if isinstance(box[0], BaseException):
        exc = box[0]
        if isinstance(exc, ConfigError):
            raise exc
        raise ConfigError(
            f"cannot list the tools of MCP server {spec.label!r}: {_reason(exc)}; check that "
            "the command runs (or the URL answers) and speaks MCP"
        ) from exc
    return tuple(box[0])


def mcp_tools(server: MCPServerSpec | str | Sequence[str], **options: Any) -> list[Tool]:
    """The tools of an MCP server, for a ``ToolEnv`` or ``Toolset``.

    ``server`` is an :class:`MCPServerSpec`, or what :meth:`MCPServerSpec.parse` reads (a URL,
    or a command line; a list is taken as the command's argv) with ``options`` as its fields.
    Made once per spec and process; a server that cannot be listed raises ``ConfigError``.
    """
    if isinstance(server, str):
        server = MCPServerSpec.parse(server, **options)
    elif not isinstance(server, MCPServerSpec):
        server = MCPServerSpec(command=tuple(server), **options)
    elif options:
        raise ConfigError("pass options as MCPServerSpec fields, not beside a spec")
    return list(_cached_tools(server))
