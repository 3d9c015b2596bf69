"""Tools for agents: ``@tool``, schemas, tool-call parsers, per-episode sessions and dispatch."""

from agentloop.tools.arg_types import ToolSchemas
from agentloop.tools.context import ToolContext
from agentloop.tools.family_parsers import detect_parser, resolve_parser
from agentloop.tools.parsers import (
    HermesParser,
    ToolCallParser,
    available_parsers,
    get_parser,
    register_parser,
)
from agentloop.tools.tool import Tool, tool
from agentloop.tools.toolset import ToolErrorKind, ToolOutput, ToolResult, ToolSession, Toolset
from agentloop.tools.truncate import truncate_to_tokens

__all__ = [
    "HermesParser",
    "Tool",
    "ToolCallParser",
    "ToolContext",
    "ToolErrorKind",
    "ToolOutput",
    "ToolResult",
    "ToolSchemas",
    "ToolSession",
    "Toolset",
    "available_parsers",
    "detect_parser",
    "get_parser",
    "register_parser",
    "resolve_parser",
    "tool",
    "truncate_to_tokens",
]
