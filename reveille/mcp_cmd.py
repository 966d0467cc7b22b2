"""`reveille mcp list`: the configured MCP servers, their state and their tools.

It reads the settings and connects to each server briefly itself (a stdio server is started
and stopped again), so it works whether or not a Reveille server is running, and shows what
a server starting now would get. Secrets (env values, header values) are never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from reveille.settings import load_settings
from tools.mcp.manager import McpClients, McpServerStatus

__all__ = ["add_parser", "format_status"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "mcp",
        help="the MCP servers of the settings ([mcp.servers.NAME])",
        description="MCP servers whose tools the agent gets.",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = sub.add_parser(
        "list", help="connect to each configured server briefly: its state and its tools"
    )
    ls.add_argument("--wait", type=float, default=15.0, help="seconds to wait for each server (15)")
    ls.add_argument("--json", action="store_true", help="one JSON object per server")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = load_settings()
    if not settings.mcp_servers:
        print("no MCP servers configured ([mcp.servers.NAME] in the settings file)")
        return 0
    servers = asyncio.run(_look(settings.mcp_servers, args.wait))
    for server in servers:
        if args.json:
            print(json.dumps(server.__dict__ | {"tools": list(server.tools)}))
        else:
            print(format_status(server))
    return 0 if all(s.state == "ready" for s in servers) else 1


async def _look(configs: Any, wait: float) -> list[McpServerStatus]:
    clients = McpClients()
    try:
        await clients.start(configs, first_connect_seconds=wait)
        return clients.servers()
    finally:
        await clients.stop()


def format_status(server: McpServerStatus) -> str:
    head = f"{server.name} ({server.transport}): {server.state}"
    if server.last_error:
        head += f" - {server.last_error}"
    lines = [head, f"  toolset mcp:{server.name}, {len(server.tools)} tool(s)"]
    lines.extend(f"  - {tool}" for tool in server.tools)
    return "\n".join(lines)
