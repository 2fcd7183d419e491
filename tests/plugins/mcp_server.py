"""A small MCP server for the tests, written with the official SDK: tools that answer, fail,
crash the server, hang, freeze it, and answer too much. Run with ``python -m
tests.plugins.mcp_server`` (stdio)."""

from __future__ import annotations

import os
import time

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("demo")


@server.tool()
def shout(text: str, times: int = 1) -> str:
    """Says the text louder, ``times`` times."""
    return " ".join([text.upper()] * times)


@server.tool()
def whoami() -> str:
    """The server's process id: a new one after a restart."""
    return str(os.getpid())


@server.tool()
def fail(why: str) -> str:
    """Fails, saying why (an error the server means to report: the model reads its text)."""
    raise ToolError(why)


@server.tool()
def crash() -> str:
    """The server exits in the middle of the call."""
    os._exit(3)


@server.tool()
async def hang(seconds: float) -> str:
    """Waits, and lets a cancellation end the wait."""
    await anyio.sleep(seconds)
    return "woke up"


@server.tool()
async def freeze(seconds: float) -> str:
    """Blocks the whole server: it answers nothing, not even a ping, until done."""
    time.sleep(seconds)
    return "thawed"


@server.tool()
def big(kilobytes: int) -> str:
    """That many KB of text."""
    return "x" * (kilobytes * 1024)


if __name__ == "__main__":
    server.run()
