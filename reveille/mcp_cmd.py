"""`reveille mcp list`: the configured MCP servers, their state and their tools.

It reads the settings and connects to each server briefly itself (a stdio server is started
and stopped again), so it works whether or not a Reveille server is running, and shows what
a server starting now would get. Secrets (env values, header values) are never printed.

`reveille mcp login NAME`: authorize Reveille with an OAuth MCP server (``auth = "oauth"``).
It prints the authorization URL to open in a browser, waits for the redirect on a loopback
port it opens (``--port``, any free one by default; a pre-registered ``client_id`` needs the
port its redirect was registered with), and stores the tokens where the servers read them
(the store: every server sharing it, and the next start, use them; they refresh them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from reveille.operator_storage import storage_to_look_at
from reveille.settings import Settings, load_settings
from tools.mcp.manager import McpClients, McpServerStatus
from tools.mcp.oauth import server_oauth, uses_oauth
from tools.mcp.oauth_login import login

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
    log_in = sub.add_parser(
        "login",
        help="authorize Reveille with an OAuth MCP server: open the URL it prints",
    )
    log_in.add_argument("name", help="the server's name ([mcp.servers.NAME])")
    log_in.add_argument(
        "--port", type=int, default=0, help="the loopback port of the redirect (any free one)"
    )
    log_in.add_argument(
        "--wait", type=float, default=300.0, help="seconds to wait for the person (300)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = load_settings()
    if args.action == "login":
        return _login(settings, args.name, port=args.port, wait=args.wait)
    if not settings.mcp_servers:
        print("no MCP servers configured ([mcp.servers.NAME] in the settings file)")
        return 0
    servers = asyncio.run(_look(settings, args.wait))
    for server in servers:
        if args.json:
            print(json.dumps(server.__dict__ | {"tools": list(server.tools)}))
        else:
            print(format_status(server))
    return 0 if all(s.state == "ready" for s in servers) else 1


async def _look(settings: Settings, wait: float) -> list[McpServerStatus]:
    # OAuth servers are looked at with the store's tokens, as a server would use them.
    values = None
    if uses_oauth(settings.mcp_servers):
        location = storage_to_look_at(settings, look=False)
        values = None if location is None else await asyncio.to_thread(location.open_telegram)
    clients = McpClients()
    try:
        await clients.start(
            settings.mcp_servers, first_connect_seconds=wait, auth=server_oauth(values)
        )
        return clients.servers()
    finally:
        await clients.stop()
        if values is not None:
            await asyncio.to_thread(values.close)


def format_status(server: McpServerStatus) -> str:
    head = f"{server.name} ({server.transport}): {server.state}"
    if server.last_error:
        head += f" - {server.last_error}"
    lines = [head, f"  toolset mcp:{server.name}, {len(server.tools)} tool(s)"]
    lines.extend(f"  - {tool}" for tool in server.tools)
    return "\n".join(lines)


def _login(settings: Settings, name: str, *, port: int, wait: float) -> int:
    config = next((s for s in settings.mcp_servers if s.name == name), None)
    if config is None or config.auth != "oauth":
        print(f'reveille mcp login: no [mcp.servers.{name}] with auth = "oauth"', file=sys.stderr)
        return 2
    location = storage_to_look_at(settings, look=False)
    assert location is not None  # look=False opens (creates) the store
    store = location.open_telegram()

    def show(url: str) -> None:
        print(f"Open this address to authorize Reveille with MCP server {name}:\n{url}", flush=True)

    try:
        done = asyncio.run(login(config, store, show=show, port=port, wait_seconds=wait))
    finally:
        store.close()
    if not done.ok:
        print(f"reveille mcp login: {name} is not authorized: {done.detail}", file=sys.stderr)
        return 1
    print(f"{name}: authorized, {done.detail}; the tokens are in the store")
    return 0
