"""The tools a run names by spec (``eval --tools``, ``data.tools``): listed live, or recorded.

Live, each ``mcp:…`` spec's server is listed once (:func:`agentloop.tools.mcp.mcp_tools`). A run
that records tool I/O also writes those tools' schemas beside its calls, to
``DIR/mcp_tools.json``; a replay that runs no live tool (miss policy ``error`` or ``fail``)
makes the tools from that file instead, so the servers need not be up, or even installed. The
file is one JSON object::

    {"v": 1, "servers": {"python server.py": [
        {"name": "weather", "description": "…", "input_schema": {"type": "object", …}}]}}

keyed by the server as the spec names it (the stdio command line, or the URL).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentloop.errors import ConfigError
from agentloop.tools.mcp import (
    MCPServerSpec,
    MCPToolSchema,
    mcp_tools,
    mcp_tools_from_schemas,
    parse_tool_spec,
)
from agentloop.tools.recording import ToolTapeConfig
from agentloop.tools.tool import Tool

__all__ = ["SCHEMAS_FILE", "read_schemas", "spec_tools"]

SCHEMAS_FILE = "mcp_tools.json"
_VERSION = 1


def spec_tools(specs: Sequence[str], tool_io: ToolTapeConfig | None = None) -> list[Tool]:
    """The tools of ``specs`` (``mcp:COMMAND ARGS`` or ``mcp:URL`` each), live or, when
    ``tool_io`` replays without running tools, from the recording's schemas; with a recording
    on, their schemas are written to it. A bad spec, a server that cannot be listed, or a
    replay whose recording lacks a server's schemas raises ``ConfigError``."""
    tool_io = tool_io or ToolTapeConfig()
    servers = [parse_tool_spec(spec) for spec in specs]
    if not servers:
        return []
    if tool_io.uses_live_tools:
        made = {spec.label: mcp_tools(spec) for spec in servers}
    else:
        assert tool_io.replay is not None  # a replay is what runs no live tool
        recorded = read_schemas(tool_io.replay)
        made = {spec.label: _replayed(spec, recorded, tool_io.replay) for spec in servers}
    if tool_io.record is not None:
        _write_schemas(tool_io.record, {label: list(tools) for label, tools in made.items()})
    return [t for tools in made.values() for t in tools]


def _replayed(
    spec: MCPServerSpec, recorded: Mapping[str, Sequence[MCPToolSchema]], replay: Path
) -> list[Tool]:
    if spec.label not in recorded:
        raise ConfigError(
            f"the recording {str(replay)!r} holds no tool schemas of the MCP server "
            f"{spec.label!r} (in {SCHEMAS_FILE}; it has {sorted(recorded)}): record a run with "
            "that server in --tools/data.tools, or replay with --replay-miss live "
            "(rollout.tools_replay_miss=live) with the server up"
        )
    return mcp_tools_from_schemas(spec, recorded[spec.label])


def read_schemas(directory: str | Path) -> dict[str, list[MCPToolSchema]]:
    """Server → its recorded tool schemas, from ``directory/mcp_tools.json`` (empty if none)."""
    path = Path(directory) / SCHEMAS_FILE
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        return {
            str(label): [
                MCPToolSchema(str(t["name"]), str(t["description"]), dict(t["input_schema"]))
                for t in tools
            ]
            for label, tools in data["servers"].items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"{path} is not a tool-schema record ({type(exc).__name__}: {exc}); record again"
        ) from exc


def _write_schemas(directory: Path, made: Mapping[str, Sequence[Tool]]) -> None:
    """Merge ``made`` into ``directory/mcp_tools.json`` (atomically; unchanged: not written)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SCHEMAS_FILE
    servers: dict[str, Any] = {
        label: [{"name": s.name, "description": s.description, "input_schema": s.input_schema}
                for s in schemas]
        for label, schemas in read_schemas(directory).items()
    }  # fmt: skip
    before = dict(servers)
    for label, tools in made.items():
        servers[label] = [
            {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
            for t in tools
        ]
    if servers == before and path.exists():
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"v": _VERSION, "servers": servers}, indent=1) + "\n")
    os.replace(tmp, path)  # a kill never leaves half a file
