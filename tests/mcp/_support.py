"""The tests' MCP servers: the SDK server of ``echo_server.py`` over stdio (a subprocess) and
over streamable HTTP (uvicorn in the test's loop, on an ephemeral loopback port)."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn

from tests.mcp.echo_server import build
from tools.mcp.config import McpServerConfig

ECHO_SCRIPT = Path(__file__).with_name("echo_server.py")


def stdio_echo(name: str = "echo", **kwargs: object) -> McpServerConfig:
    """The echo server over stdio, run by this Python."""
    return McpServerConfig(
        name=name,
        command=(sys.executable, str(ECHO_SCRIPT)),
        **kwargs,  # type: ignore[arg-type]
    )


@asynccontextmanager
async def http_echo() -> AsyncIterator[str]:
    """The echo server over streamable HTTP; yields its url."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(build().streamable_http_app(), log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        await task
        sock.close()
