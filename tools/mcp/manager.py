"""The MCP servers of this process: one connection each, started on the server's event loop
by the composition root, and their tools kept current in every agent registry attached.

``mcp_clients`` is the process's one set (like ``process_registry``): ``serve`` starts it
with ``[mcp.servers.*]`` and stops it at exit; ``build_default_registry`` attaches each
registry it builds, so every surface's turns (and the sub-agents they start, whose
toolsets name ``mcp:NAME``) get the tools, and a ``tools/list_changed`` reaches them all.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx2

from agent.providers.base import ModelProvider
from agent.tools import Tool, ToolRegistry
from tools.mcp.adapter import make_tools, tool_name
from tools.mcp.config import McpServerConfig
from tools.mcp.connection import McpConnection, State

logger = logging.getLogger(__name__)

FIRST_CONNECT_SECONDS = 15.0


@dataclass(frozen=True)
class McpServerStatus:
    """One server as an operator sees it."""

    name: str
    transport: str
    state: State
    last_error: str
    tools: tuple[str, ...]  # the namespaced names the agent calls
    restarts: int


class McpClients:
    """The connections of this process, and the registries that offer their tools."""

    def __init__(self) -> None:
        self._connections: dict[str, McpConnection] = {}
        self._registries: weakref.WeakSet[ToolRegistry] = weakref.WeakSet()

    async def start(
        self,
        configs: Sequence[McpServerConfig],
        *,
        first_connect_seconds: float = FIRST_CONNECT_SECONDS,
        min_backoff: float | None = None,
        model: ModelProvider | None = None,
        auth: Callable[[McpServerConfig], httpx2.Auth | None] | None = None,
    ) -> list[McpConnection]:
        """Connect each server on this loop; waits (at most ``first_connect_seconds``) for
        each first attempt, so the first turn sees the tools of the servers that are up.
        ``model`` answers the servers' sampling requests; ``auth`` gives an HTTP server's
        client its OAuth (``tools.mcp.oauth.oauth_for``). Returns the connections started,
        for ``stop``."""
        started: list[McpConnection] = []
        for config in configs:
            kwargs = {} if min_backoff is None else {"min_backoff": min_backoff}
            connection = McpConnection(
                config,
                on_tools=self._refresh,
                model=model,
                auth=None if auth is None else functools.partial(auth, config),
                **kwargs,
            )
            self._connections[config.name] = connection
            connection.start()
            started.append(connection)
        await asyncio.gather(*(c.wait_settled(first_connect_seconds) for c in started))
        return started

    async def stop(self, connections: Sequence[McpConnection] | None = None) -> None:
        """Close ``connections`` (default: all) and take their tools off the registries;
        another ``serve`` in the same process (tests) keeps its own."""
        closing = list(self._connections.values()) if connections is None else list(connections)
        for connection in closing:
            if self._connections.get(connection.name) is connection:
                del self._connections[connection.name]
        await asyncio.gather(*(c.stop() for c in closing))
        for connection in closing:
            self._put(connection, offered=False)

    def attach(self, registry: ToolRegistry) -> None:
        """Offer the servers' tools in ``registry`` from now on (and keep them current)."""
        self._registries.add(registry)
        for connection in self._connections.values():
            _offer(registry, connection, make_tools(connection))

    def connection(self, name: str) -> McpConnection | None:
        return self._connections.get(name)

    def servers(self) -> list[McpServerStatus]:
        return [
            McpServerStatus(
                name=c.name,
                transport=c.config.transport,
                state=c.state,
                last_error=c.last_error,
                tools=tuple(tool_name(c.name, t.name) for t in c.tools),
                restarts=c.restarts,
            )
            for c in self._connections.values()
        ]

    def _refresh(self, connection: McpConnection) -> None:
        self._put(connection, offered=True)

    def _put(self, connection: McpConnection, *, offered: bool) -> None:
        tools = make_tools(connection) if offered else []
        for registry in list(self._registries):
            _offer(registry, connection, tools)


def _offer(registry: ToolRegistry, connection: McpConnection, tools: list[Tool]) -> None:
    """Put ``tools`` in ``registry`` as the server's toolset; names another tool already has
    (two servers' names that meet after namespacing) leave the server's tools out, said."""
    try:
        registry.replace_toolset(connection.config.toolset, tools)
    except ValueError as exc:
        logger.warning("MCP server %s: tools not offered: %s", connection.name, exc)


mcp_clients = McpClients()
