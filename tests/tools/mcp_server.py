"""A real MCP server for the tests, written with the official SDK: stdio, or streamable HTTP.

Run ``python mcp_server.py`` (stdio) or ``python mcp_server.py http PORT``. Its tools cover what
the client must handle: results, images, the server's own errors, a hang, a crash, and a
``python`` tool like Calc's (the tiny tool-calling model calls it).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import sys

# Tests: a server that fails at start-up (checked before the SDK's imports, which take seconds).
if os.path.exists(os.environ.get("AGENTLOOP_TEST_MCP_FAIL_IF") or "\0"):
    sys.exit("refusing to start: AGENTLOOP_TEST_MCP_FAIL_IF exists")

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image

__all__ = ["server"]

server = MCPServer("agentloop-test", log_level="WARNING")
_in_flight = [0, 0]  # calls of `busy` now, and the most ever at once


@server.tool()
async def busy(seconds: float) -> int:
    """Stay busy for a while; returns the most calls of this tool ever in flight at once.

    Args:
        seconds: How long.
    """
    _in_flight[0] += 1
    _in_flight[1] = max(_in_flight)
    try:
        await asyncio.sleep(seconds)
    finally:
        _in_flight[0] -= 1
    return _in_flight[1]


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First addend.
        b: Second addend.
    """
    return a + b


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
def fail(message: str) -> str:
    """Always fails with ``message``."""
    raise ToolError(message)


@server.tool()
async def hang() -> str:
    """Never returns."""
    await asyncio.Event().wait()
    return "unreachable"


@server.tool()
def die() -> str:
    """Kills the server process."""
    os._exit(3)


@server.tool()
def square_image(side: int) -> Image:
    """A red square image.

    Args:
        side: Side length in pixels.
    """
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.new("RGB", (side, side), "red").save(buf, format="PNG")
    return Image(data=buf.getvalue(), format="png")


@server.tool()
def python(code: str) -> str:
    """Run Python code and see what it prints."""  # short: the tiny model's context is small
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(code, {})
    except Exception as exc:
        return f"{out.getvalue()}{type(exc).__name__}: {exc}"
    return out.getvalue().rstrip("\n") or "(no output)"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--only"]:  # serve only these tools: `--only python,add`
        keep = sys.argv.pop(2).split(",")
        sys.argv.pop(1)
        for name in [t.name for t in asyncio.run(server.list_tools()) if t.name not in keep]:
            server.remove_tool(name)
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
