"""Slack's Socket Mode: events and button presses over a WebSocket the bot opens, through
slack-sdk's aiohttp client (``slack_sdk.socket_mode.aiohttp.SocketModeClient``).

The client asks ``apps.connections.open`` (with the app-level token, on the Web API root the
adapter was given) for the socket's URL, connects, and reads Slack's ``hello``; each
envelope (``events_api``, ``interactive``) goes to ``take`` and is acknowledged by its
``envelope_id`` only once ``take`` returned, so an event Slack saw acknowledged is stored
(Slack sends an unacknowledged one again). A ``disconnect`` message (Slack refreshing the
socket) and a closed socket make the client open a new one. ``run()`` holds the connection
until cancelled; the adapter runs it only while this server holds the bot's lease.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from agent.messages import JSONObject
from gateway.surfaces.slack.intake import clean

__all__ = ["SocketMode"]

logger = logging.getLogger(__name__)

Take = Callable[[str, JSONObject], Awaitable[None]]


class SocketMode:
    """One Socket Mode connection of the app (see the module docstring). ``take(kind,
    payload)`` gets each envelope's type and payload."""

    def __init__(self, app_token: str, base_url: str, take: Take) -> None:
        self.app_token = app_token
        self.base_url = base_url
        self.take = take
        self.connected = asyncio.Event()

    async def run(self) -> None:
        # Imported here: the client makes its aiohttp session (and tasks) when built, so it is
        # built on the running loop, once per run.
        from slack_sdk.socket_mode.aiohttp import SocketModeClient

        client = SocketModeClient(
            app_token=self.app_token,
            web_client=AsyncWebClient(base_url=self.base_url),
            logger=logger,
        )
        client.socket_mode_request_listeners.append(self._on_request)
        try:
            await client.connect()
            self.connected.set()
            logger.info("Slack: Socket Mode connected")
            await asyncio.Event().wait()
        finally:
            self.connected.clear()
            await client.close()

    async def _on_request(
        self, client: AsyncBaseSocketModeClient, request: SocketModeRequest
    ) -> None:
        payload = clean(request.payload)
        if request.type in ("events_api", "interactive") and isinstance(payload, dict):
            try:
                await self.take(request.type, payload)
            except Exception:
                # Not acknowledged: Slack sends it again.
                logger.exception("Slack: could not take envelope %s", request.envelope_id)
                return
        await client.send_socket_mode_response(SocketModeResponse(request.envelope_id))
