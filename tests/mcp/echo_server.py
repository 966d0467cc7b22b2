"""A small MCP server written with the SDK, for the tests: run as a script it serves stdio;
``app()`` is the same server for streamable HTTP.

Tools: ``say`` (read-only), ``note`` (writes: asks approval by default), ``slow`` (sleeps),
``die`` (the process exits), ``grow`` (adds ``double`` and says the list changed), ``fail``
(an ``isError`` result), ``confirm`` (asks the user a yes/no question), ``auth`` (whether the
request carried the expected bearer header), ``pid``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel


class Go(BaseModel):
    go: bool


def build() -> MCPServer:
    server = MCPServer("echo")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def say(text: str) -> str:
        """Echo the text back."""
        return f"echo: {text}"

    @server.tool()
    def note(text: str) -> str:
        """Write a note (not read-only)."""
        return f"noted: {text}"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def slow(seconds: float) -> str:
        """Sleep, then answer; a cancelled call is written to $ECHO_CANCELLED_FILE."""
        try:
            await asyncio.sleep(seconds)
        except BaseException:
            if marker := os.environ.get("ECHO_CANCELLED_FILE"):
                Path(marker).write_text("cancelled")
            raise
        return "slept"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def die() -> str:
        """The server process exits at once."""
        os._exit(3)

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def pid() -> str:
        """The server's process id."""
        return str(os.getpid())

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def fail() -> str:
        """Always fails."""
        raise ToolError("this tool always fails")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def grow(ctx: Context) -> str:
        """Add the tool `double` and tell the client the list changed."""

        def double(x: int) -> str:
            """Twice x."""
            return str(2 * x)

        server.add_tool(double, annotations=ToolAnnotations(readOnlyHint=True))
        await ctx.session.send_tool_list_changed()
        return "grown"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def confirm(question: str, ctx: Context) -> str:
        """Ask the user a yes/no question."""
        answer = await ctx.elicit(question, Go)
        return f"answer: {answer.action} {getattr(answer, 'data', None)}"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def auth(ctx: Context) -> str:
        """Whether the request carried the expected Authorization header."""
        headers = ctx.headers or {}
        expected = f"Bearer {os.environ.get('ECHO_EXPECTED_TOKEN', '')}"
        return "authorized" if headers.get("authorization") == expected else "anonymous"

    return server


if __name__ == "__main__":
    if os.environ.get("ECHO_MARK"):
        print(f"echo server {os.environ['ECHO_MARK']} started", file=sys.stderr)
    build().run()
