"""Slack's Socket Mode: events and button presses over a WebSocket the bot opens, through
slack-sdk's aiohttp client (``slack_sdk.socket_mode.aiohttp.SocketModeClient``).

The client asks ``apps.connections.open`` (with the app-level token, on the Web API root the
adapter was given) for the socket's URL, connects, and reads Slack's ``hello``; each
envelope (``events_api``, ``interactive``, ``slash_commands``) goes to ``take`` and is
acknowledged by its ``envelope_id`` (with what ``take`` returned: a command's answer) only
once ``take`` returned, so an event Slack saw acknowledged is stored
(Slack sends an unacknowledged one again). A ``disconnect`` message (Slack refreshing the
socket) and a closed socket make the client open a new one. ``run()`` holds the connection
until cancelled; the adapter runs it only while this server holds the bot's lease.

An app-level token Slack refuses (``apps.connections.open``: ``invalid_auth``,
``not_authed``...) is ``SlackTokenRefused``: ``check()`` at start stops the start, and
``run()`` ends with it (never retried). Any other failure to connect (Slack down, a 5xx, a
network error) is retried after ``first_delay`` seconds, doubled each time up to
``max_delay``, one warning line a try; a connection made starts the back-off over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from agent.messages import JSONObject
from gateway.surfaces.slack.intake import clean
from gateway.surfaces.slack.tokens import REFUSED_TOKEN_ERRORS, SlackTokenRefused

__all__ = ["SocketMode"]

logger = logging.getLogger(__name__)

# An envelope's type and payload to what its acknowledgement carries (a slash command's answer).
Take = Callable[[str, JSONObject], Awaitable["JSONObject | None"]]
_TAKEN = frozenset({"events_api", "interactive", "slash_commands"})
# The back-off's wait (a name of its own, so a test can watch the delays without waiting).
_sleep = asyncio.sleep


class _Client(SocketModeClient):
    """slack-sdk's client, first connecting to the URL ``SocketMode`` already asked for (a
    reconnect asks for a new one, as the client does)."""

    first_url: str | None = None

    async def issue_new_wss_url(self) -> str:
        url, self.first_url = self.first_url, None
        return url or await super().issue_new_wss_url()


class SocketMode:
    """One Socket Mode connection of the app (see the module docstring). ``take(kind,
    payload)`` gets each envelope's type and payload."""

    def __init__(
        self,
        app_token: str,
        base_url: str,
        take: Take,
        *,
        first_delay: float = 1.0,
        max_delay: float = 60.0,
    ) -> None:
        self.app_token = app_token
        self.base_url = base_url
        self.take = take
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.connected = asyncio.Event()

    def _refused(self, exc: SlackApiError) -> SlackTokenRefused | None:
        error = str(exc.response.get("error") or "")
        if error not in REFUSED_TOKEN_ERRORS:
            return None
        return SlackTokenRefused(
            f"Slack refused SLACK_APP_TOKEN at {self.base_url} ({error}); copy the app-level "
            "token (connections:write) again from the app's Basic Information page"
        )

    async def check(self) -> None:
        """Ask ``apps.connections.open`` once: ``SlackTokenRefused`` for a refused app token;
        anything else (Slack unreachable) is left to ``run()``'s retries. The URL it gives
        is not used (each expires unused)."""
        try:
            await AsyncWebClient(base_url=self.base_url).apps_connections_open(
                app_token=self.app_token
            )
        except SlackApiError as exc:
            refused = self._refused(exc)
            if refused is not None:
                raise refused from None
            logger.warning("Slack: apps.connections.open failed (%s); starting anyway", exc)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            logger.warning("Slack: cannot reach %s (%s); starting anyway", self.base_url, exc)

    async def run(self) -> None:
        """Connect (retrying with the back-off) and hold the connection until cancelled."""
        delay = self.first_delay
        while True:
            try:
                await self._connected()
            except SlackApiError as exc:
                refused = self._refused(exc)
                if refused is not None:
                    raise refused from None
                why: object = exc.response.get("error") or exc
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                why = exc
            else:
                delay = self.first_delay
                continue
            logger.warning(
                "Slack: Socket Mode could not connect (%s); trying again in %.0f s", why, delay
            )
            await _sleep(delay)
            delay = min(delay * 2, self.max_delay)

    async def _connected(self) -> None:
        """One client: connect and hold it until cancelled (or, should it return, closed)."""
        web = AsyncWebClient(base_url=self.base_url)
        # Asked here, not by the client: its ``connect()`` retries a failed ask every 5 s
        # forever, logging each; here a failure reaches ``run()``'s back-off (or refusal).
        opened = await web.apps_connections_open(app_token=self.app_token)
        # Built here, on the running loop: the client makes its aiohttp session when built.
        client = _Client(app_token=self.app_token, web_client=web, logger=logger)
        client.first_url = str(opened["url"])
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
        answer = None
        if request.type in _TAKEN and isinstance(payload, dict):
            try:
                answer = await self.take(request.type, payload)
            except Exception:
                # Not acknowledged: Slack sends it again.
                logger.exception("Slack: could not take envelope %s", request.envelope_id)
                return
        await client.send_socket_mode_response(SocketModeResponse(request.envelope_id, answer))
