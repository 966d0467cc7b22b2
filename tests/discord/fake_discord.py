"""A stand-in for Discord: REST v10 and the Gateway, one real aiohttp server on loopback.

discord.py reaches it through its own settings only (``Route.BASE`` for REST, the ``url``
of ``GET /gateway/bot`` for the Gateway), so what is tested is the library as shipped.

REST (``/api/v10``, ``Authorization: Bot <token>`` or 401): ``gateway/bot``, ``users/@me``,
``oauth2/applications/@me``, ``channels/{id}/messages`` (create; a message over 2,000
characters is a 400 like Discord's), ``channels/{id}/messages/{id}`` (edit),
``channels/{id}/typing``, ``interactions/{id}/{token}/callback`` and
``applications/{id}/commands`` (bulk overwrite, list). Tests inject a 429 with
``Retry-After`` (and the ``Via`` header Discord's edge sends: without it discord.py takes a
429 for a Cloudflare ban) and JSON errors such as 50013 (Missing Permissions) and 10003
(Unknown Channel), per channel.

Gateway (``/gateway``, JSON text frames): HELLO with ``heartbeat_interval``; IDENTIFY ->
READY (``session_id``, ``resume_gateway_url``, the guild unavailable) then GUILD_CREATE (a
text channel and a thread); heartbeat -> ACK; dispatches the test pushes (MESSAGE_CREATE,
INTERACTION_CREATE) with increasing sequence numbers. ``drop`` closes the socket the way
a Discord edge does (4000, reconnect); events pushed meanwhile are kept, and a RESUME with
the session id and last sequence replays what the client missed, then RESUMED.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import WSMsgType, web

TOKEN = "fake-discord-bot-token"
BOT_ID = "900000000000000001"
APP_ID = "900000000000000002"
GUILD_ID = "800000000000000001"
CHANNEL_ID = "800000000000000010"
THREAD_ID = "800000000000000020"
TIMESTAMP = "2026-12-04T00:00:00.000000+00:00"
MAX_CONTENT = 2000
_DISCORD_EPOCH_MS = 1_420_070_400_000

T = TypeVar("T")


@dataclass
class Sent:
    """A message the bot created, as last edited."""

    channel_id: str
    id: str
    content: str
    components: list[dict[str, Any]] = field(default_factory=list)
    allowed_mentions: dict[str, Any] | None = None
    edits: int = 0
    at: float = field(default_factory=time.time)


@dataclass
class Callback:
    """An interaction response the bot sent (``POST .../callback``)."""

    interaction_id: str
    type: int
    data: dict[str, Any]


@dataclass
class Failure:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def user(user_id: str, name: str | None = None, *, bot: bool = False) -> dict[str, Any]:
    return {
        "id": user_id,
        "username": name or f"user{user_id[-4:]}",
        "discriminator": "0",
        "global_name": name,
        "avatar": None,
        "bot": bot,
    }


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON answer as Discord sends it: ``Content-Type: application/json`` with no charset
    (discord.py compares the header exactly before it parses a body as JSON)."""
    return web.Response(
        body=json.dumps(body).encode(),
        status=status,
        headers={**(headers or {}), "Content-Type": "application/json"},
    )


def _member() -> dict[str, Any]:
    return {"roles": [], "joined_at": TIMESTAMP, "deaf": False, "mute": False, "flags": 0}


class FakeDiscord:
    """See the module docstring. ``await start()`` in the test's loop, ``await stop()``."""

    def __init__(self) -> None:
        self.token = TOKEN
        self._last_id = 0
        self.sent: list[Sent] = []
        self.received: list[dict[str, Any]] = []  # users' messages, for channel history
        # Held replies: new messages wait while ``holding``; ``discard_held`` loses them.
        self.holding = False
        self.discard_held = False
        self.held = 0
        self.blocked: set[str] = set()  # channels where every send is refused (50007)
        self.rate_limited: list[float] = []  # when each 429 was answered (epoch seconds)
        self._text_failures: list[tuple[str, Failure]] = []
        self.callbacks: list[Callback] = []
        self.commands: list[dict[str, Any]] = []
        self.typing: list[str] = []
        self.requests: list[tuple[str, str, float]] = []
        self.identifies: list[dict[str, Any]] = []
        self.resumes: list[dict[str, Any]] = []
        self.heartbeats = 0
        self.session_id = "fake-session-1"
        self.sequence = 0
        self._history: list[dict[str, Any]] = []  # every dispatch, for RESUME
        self._socket: web.WebSocketResponse | None = None
        self._connected = asyncio.Event()
        self._failures: dict[str, list[Failure]] = {}
        self._pressed: dict[str, str] = {}  # interaction id -> the message pressed
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ----------------------------------------------------------------- lifecycle

    async def start(self, port: int = 0) -> FakeDiscord:
        app = web.Application()
        r = app.router
        r.add_get("/gateway", self._gateway)
        r.add_get("/api/v10/gateway/bot", self._gateway_bot)
        r.add_get("/api/v10/users/@me", self._me)
        r.add_get("/api/v10/oauth2/applications/@me", self._application)
        r.add_post("/api/v10/channels/{channel}/messages", self._create_message)
        r.add_get("/api/v10/channels/{channel}/messages", self._channel_messages)
        r.add_patch("/api/v10/channels/{channel}/messages/{message}", self._edit_message)
        r.add_post("/api/v10/channels/{channel}/typing", self._typing)
        r.add_post("/api/v10/interactions/{id}/{token}/callback", self._callback)
        r.add_put("/api/v10/applications/{app}/commands", self._put_commands)
        r.add_get("/api/v10/applications/{app}/commands", self._get_commands)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._socket is not None:
            await self._socket.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v10"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/gateway"

    # ----------------------------------------------------------------- test controls

    def fail(self, channel_id: str, status: int, code: int, message: str, times: int = 1) -> None:
        """The next ``times`` REST calls on ``channel_id`` answer ``status`` with ``code``."""
        failure = Failure(status, {"message": message, "code": code})
        self._failures.setdefault(channel_id, []).extend([failure] * times)

    def rate_limit(self, channel_id: str, retry_after: float, times: int = 1) -> None:
        """The next ``times`` REST calls on ``channel_id`` get a 429 like Discord's."""
        body = {"message": "You are being rate limited.", "retry_after": retry_after}
        headers = {
            "Retry-After": str(retry_after),
            "Via": "1.1 google",
            "X-RateLimit-Scope": "user",
        }
        failure = Failure(429, {**body, "global": False}, headers)
        self._failures.setdefault(channel_id, []).extend([failure] * times)

    def rate_limit_text(self, when_text: str, retry_after: float) -> None:
        """The next message whose content holds ``when_text`` gets a 429 like Discord's."""
        body = {"message": "You are being rate limited.", "retry_after": retry_after}
        headers = {"Retry-After": str(retry_after), "Via": "1.1 google"}
        self._text_failures.append((when_text, Failure(429, {**body, "global": False}, headers)))

    async def wait_connected(self, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            await self._connected.wait()

    async def drop(self) -> None:
        """Close the socket as an edge does when it goes away: the client should RESUME."""
        socket, self._socket = self._socket, None
        self._connected.clear()
        if socket is not None:
            await socket.close(code=4000, message=b"edge went away")

    async def message(
        self,
        content: str,
        *,
        author: str = "42",
        channel_id: str = "700000000000000042",
        guild_id: str | None = None,
        name: str | None = None,
        message_id: str | None = None,
    ) -> str:
        """A user's message: a MESSAGE_CREATE dispatch (a DM when ``guild_id`` is None);
        ``message_id`` of an earlier one dispatches it again, as a replay would."""
        message_id = message_id or self._snowflake()
        data: dict[str, Any] = {
            **self._message_fields(message_id, channel_id, content),
            "author": user(author, name),
        }
        if guild_id is not None:
            data["guild_id"] = guild_id
            data["member"] = _member()
        self.received = [m for m in self.received if m["id"] != message_id] + [data]
        await self.dispatch("MESSAGE_CREATE", data)
        return message_id

    async def press(
        self, message: Sent, custom_id: str, *, by: str = "42", guild_id: str | None = None
    ) -> str:
        """A button press on ``message``: INTERACTION_CREATE of a message component."""
        return await self._interaction(
            3,
            {"custom_id": custom_id, "component_type": 2},
            channel_id=message.channel_id,
            guild_id=guild_id,
            by=by,
            message=self._message_payload(message),
        )

    async def command(
        self,
        name: str,
        *,
        by: str = "42",
        channel_id: str = "700000000000000042",
        guild_id: str | None = None,
    ) -> str:
        """A slash command used: INTERACTION_CREATE of an application command."""
        registered = next((c for c in self.commands if c["name"] == name), None)
        data = {"id": registered["id"] if registered else "1", "name": name, "type": 1}
        return await self._interaction(2, data, channel_id=channel_id, guild_id=guild_id, by=by)

    def buttons(self, message: Sent) -> list[tuple[str, str]]:
        """(label, custom_id) of each button a message carries now."""
        return [
            (b["label"], b["custom_id"])
            for row in message.components
            for b in row.get("components", [])
        ]

    def messages_to(self, channel_id: str) -> list[Sent]:
        return [m for m in self.sent if m.channel_id == channel_id]

    def texts_to(self, channel_id: str) -> list[str]:
        return [m.content for m in self.messages_to(channel_id)]

    def callback_for(self, interaction_id: str) -> Callback | None:
        return next((c for c in self.callbacks if c.interaction_id == interaction_id), None)

    # ----------------------------------------------------------------- gateway

    async def dispatch(self, event: str, data: dict[str, Any]) -> None:
        self.sequence += 1
        frame = {"op": 0, "t": event, "s": self.sequence, "d": data}
        self._history.append(frame)
        if self._socket is not None and not self._socket.closed:
            await self._socket.send_str(json.dumps(frame))

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        await socket.send_str(json.dumps({"op": 10, "d": {"heartbeat_interval": 45000}}))
        async for frame in socket:
            if frame.type is not WSMsgType.TEXT:
                continue
            payload = json.loads(frame.data)
            op = payload.get("op")
            if op == 1:
                self.heartbeats += 1
                await socket.send_str(json.dumps({"op": 11}))
            elif op == 2:
                await self._identify(socket, payload["d"])
            elif op == 6:
                await self._resume(socket, payload["d"])
        return socket

    async def _identify(self, socket: web.WebSocketResponse, data: dict[str, Any]) -> None:
        if data.get("token") != self.token:
            await socket.close(code=4004, message=b"Authentication failed.")
            return
        self.identifies.append(data)
        self._socket = socket
        await self.dispatch(
            "READY",
            {
                "v": 10,
                "user": user(BOT_ID, "reveille", bot=True),
                "guilds": [{"id": GUILD_ID, "unavailable": True}],
                "session_id": self.session_id,
                "resume_gateway_url": self.gateway_url,
                "application": {"id": APP_ID, "flags": 0},
                "shard": [0, 1],
                "private_channels": [],
            },
        )
        await self.dispatch("GUILD_CREATE", self._guild())
        self._connected.set()

    async def _resume(self, socket: web.WebSocketResponse, data: dict[str, Any]) -> None:
        self.resumes.append(data)
        if data.get("token") != self.token or data.get("session_id") != self.session_id:
            await socket.send_str(json.dumps({"op": 9, "d": False}))
            return
        self._socket = socket
        seen = int(data.get("seq") or 0)
        for frame in self._history:
            if frame["s"] > seen:
                await socket.send_str(json.dumps(frame))
        await self.dispatch("RESUMED", {})
        self._connected.set()

    # ----------------------------------------------------------------- REST

    def _authorised(self, request: web.Request) -> bool:
        self.requests.append((request.method, request.path, asyncio.get_running_loop().time()))
        return request.headers.get("Authorization") == f"Bot {self.token}"

    def _failure(self, channel_id: str) -> web.Response | None:
        queue = self._failures.get(channel_id)
        if not queue:
            return None
        failure = queue.pop(0)
        return _json(failure.body, status=failure.status, headers=failure.headers)

    def _refused(self, channel_id: str, content: str) -> web.Response | None:
        """A blocked channel's refusal, or a 429 told for this text."""
        if channel_id in self.blocked:
            body = {"message": "Cannot send messages to this user", "code": 50007}
            return _json(body, status=403)
        for at, (text, failure) in enumerate(self._text_failures):
            if text in content:
                del self._text_failures[at]
                self.rate_limited.append(time.time())
                return _json(failure.body, status=failure.status, headers=failure.headers)
        return None

    async def _channel_messages(self, request: web.Request) -> web.Response:
        """A channel's messages, newest first, as ``GET /channels/{id}/messages``."""
        if not self._authorised(request):
            return self._unauthorised()
        channel_id = request.match_info["channel"]
        limit = int(request.query.get("limit", "50"))
        before = int(request.query.get("before") or 1 << 63)
        after = int(request.query.get("after") or 0)
        theirs = [m for m in self.received if m["channel_id"] == channel_id]
        ours = [self._message_payload(m) for m in self.messages_to(channel_id)]
        found = [m for m in theirs + ours if after < int(m["id"]) < before]
        found.sort(key=lambda m: int(m["id"]), reverse=True)
        return _json(found[:limit])

    @staticmethod
    def _unauthorised() -> web.Response:
        return _json({"message": "401: Unauthorized", "code": 0}, status=401)

    async def _gateway_bot(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return self._unauthorised()
        limit = {"total": 1000, "remaining": 999, "reset_after": 0, "max_concurrency": 1}
        return _json({"url": self.gateway_url, "shards": 1, "session_start_limit": limit})

    async def _me(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return self._unauthorised()
        return _json(user(BOT_ID, "reveille", bot=True))

    async def _application(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return self._unauthorised()
        return _json(
            {
                "id": APP_ID,
                "name": "reveille",
                "icon": None,
                "description": "",
                "bot_public": False,
                "bot_require_code_grant": False,
                "owner": user("42", "owner"),
                "verify_key": "0" * 64,
                "flags": 0,
                "team": None,
            }
        )

    async def _create_message(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return self._unauthorised()
        channel_id = request.match_info["channel"]
        if (failed := self._failure(channel_id)) is not None:
            return failed
        body = await request.json()
        content = str(body.get("content") or "")
        if (failed := self._refused(channel_id, content)) is not None:
            return failed
        if len(content) > MAX_CONTENT:
            return self._too_long()
        if self.holding:
            self.held += 1
            while self.holding:
                await asyncio.sleep(0.02)
            if self.discard_held:  # its sender was killed meanwhile: it never arrives
                return _json({"message": "lost", "code": 0}, status=500)
        sent = Sent(
            channel_id,
            self._snowflake(),
            content,
            list(body.get("components") or []),
            body.get("allowed_mentions"),
        )
        self.sent.append(sent)
        return _json(self._message_payload(sent))

    async def _edit_message(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return self._unauthorised()
        channel_id = request.match_info["channel"]
        if (failed := self._failure(channel_id)) is not None:
            return failed
        sent = next((m for m in self.sent if m.id == request.match_info["message"]), None)
        if sent is None or sent.channel_id != channel_id:
            return _json({"message": "Unknown Message", "code": 10008}, status=404)
        body = await request.json()
        if (failed := self._refused(channel_id, str(body.get("content") or ""))) is not None:
            return failed
        if "content" in body:
            content = str(body.get("content") or "")
            if len(content) > MAX_CONTENT:
                return self._too_long()
            sent.content = content
        if "components" in body:
            sent.components = list(body.get("components") or [])
        sent.edits += 1
        return _json(self._message_payload(sent))

    async def _typing(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return self._unauthorised()
        channel_id = request.match_info["channel"]
        self.typing.append(channel_id)
        return web.Response(status=204)

    async def _callback(self, request: web.Request) -> web.Response:
        # Interaction callbacks are authorised by their token, not the bot's.
        self.requests.append((request.method, request.path, asyncio.get_running_loop().time()))
        body = await request.json()
        interaction_id = request.match_info["id"]
        self.callbacks.append(Callback(interaction_id, int(body["type"]), body.get("data") or {}))
        if body["type"] == 7:  # UPDATE_MESSAGE: the pressed message changes
            for sent in self.sent:
                if sent.id == self._pressed.get(interaction_id):
                    data = body.get("data") or {}
                    if "content" in data:
                        sent.content = data["content"]
                    if "components" in data:
                        sent.components = list(data["components"] or [])
                    sent.edits += 1
        flags = int((body.get("data") or {}).get("flags") or 0)
        return _json(
            {
                "interaction": {
                    "id": interaction_id,
                    "type": 2,
                    "response_message_loading": False,
                    "response_message_ephemeral": bool(flags & 64),
                }
            }
        )

    async def _put_commands(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return self._unauthorised()
        body = await request.json()
        self.commands = [
            {
                **command,
                "id": self._snowflake(),
                "application_id": APP_ID,
                "type": command.get("type", 1),
                "version": "1",
                "default_member_permissions": None,
                "dm_permission": True,
                "nsfw": False,
            }
            for command in body
        ]
        return _json(self.commands)

    async def _get_commands(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return self._unauthorised()
        return _json(self.commands)

    # ----------------------------------------------------------------- payloads

    async def _interaction(
        self,
        kind: int,
        data: dict[str, Any],
        *,
        channel_id: str,
        guild_id: str | None,
        by: str,
        message: dict[str, Any] | None = None,
    ) -> str:
        interaction_id = self._snowflake()
        payload: dict[str, Any] = {
            "id": interaction_id,
            "application_id": APP_ID,
            "type": kind,
            "data": data,
            "token": f"itoken-{interaction_id}",
            "version": 1,
            "channel_id": channel_id,
            "app_permissions": "0",
            "attachment_size_limit": 25 * 1024 * 1024,
            "locale": "en-US",
            "entitlements": [],
            "authorizing_integration_owners": {},
            "context": 1,
        }
        if guild_id is None:  # a direct message: the presser is a user
            payload["channel"] = {"id": channel_id, "type": 1}
            payload["user"] = user(by)
        else:  # in a guild: a member
            kind = 11 if channel_id == THREAD_ID else 0
            payload["channel"] = {"id": channel_id, "type": kind, "guild_id": guild_id}
            payload["guild_id"] = guild_id
            payload["member"] = {**_member(), "user": user(by), "permissions": "0"}
        if message is not None:
            payload["message"] = message
            self._pressed[interaction_id] = message["id"]
        await self.dispatch("INTERACTION_CREATE", payload)
        return interaction_id

    def _snowflake(self) -> str:
        """A new id, increasing, that encodes now as Discord's do (``created_at`` reads it)."""
        now = (int(time.time() * 1000) - _DISCORD_EPOCH_MS) << 22
        self._last_id = max(self._last_id + 1, now)
        return str(self._last_id)

    @staticmethod
    def _too_long() -> web.Response:
        body = {
            "message": "Invalid Form Body",
            "code": 50035,
            "errors": {"content": {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH"}]}},
        }
        return _json(body, status=400)

    @staticmethod
    def _message_fields(message_id: str, channel_id: str, content: str) -> dict[str, Any]:
        return {
            "id": message_id,
            "channel_id": channel_id,
            "content": content,
            "timestamp": TIMESTAMP,
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "pinned": False,
            "type": 0,
            "flags": 0,
        }

    def _message_payload(self, sent: Sent) -> dict[str, Any]:
        return {
            **self._message_fields(sent.id, sent.channel_id, sent.content),
            "author": user(BOT_ID, "reveille", bot=True),
            "components": sent.components,
        }

    def _guild(self) -> dict[str, Any]:
        everyone = {
            "id": GUILD_ID,
            "name": "@everyone",
            "permissions": str((1 << 41) - 1),
            "position": 0,
            "color": 0,
            "hoist": False,
            "managed": False,
            "mentionable": False,
            "flags": 0,
        }
        return {
            "id": GUILD_ID,
            "name": "Reveille test guild",
            "icon": None,
            "owner_id": "42",
            "features": [],
            "roles": [everyone],
            "emojis": [],
            "stickers": [],
            "member_count": 3,
            "members": [
                {**_member(), "user": user(BOT_ID, "reveille", bot=True)},
            ],
            "channels": [
                {
                    "id": CHANNEL_ID,
                    "type": 0,
                    "name": "general",
                    "position": 0,
                    "permission_overwrites": [],
                    "guild_id": GUILD_ID,
                }
            ],
            "threads": [
                {
                    "id": THREAD_ID,
                    "type": 11,
                    "name": "a thread",
                    "parent_id": CHANNEL_ID,
                    "guild_id": GUILD_ID,
                    "owner_id": "42",
                    "message_count": 0,
                    "member_count": 1,
                    "thread_metadata": {
                        "archived": False,
                        "auto_archive_duration": 1440,
                        "archive_timestamp": TIMESTAMP,
                        "locked": False,
                    },
                }
            ],
            "voice_states": [],
            "presences": [],
            "large": False,
            "unavailable": False,
            "mfa_level": 0,
            "verification_level": 0,
            "explicit_content_filter": 0,
            "default_message_notifications": 0,
            "premium_tier": 0,
            "nsfw_level": 0,
            "preferred_locale": "en-US",
            "system_channel_flags": 0,
            "joined_at": TIMESTAMP,
        }


class ThreadedFakeDiscord:
    """The stand-in on a loop of its own thread, for tests that run ``reveille serve`` and
    wait synchronously: ``call`` runs one of its coroutines there and returns the result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.fake = self.call(lambda: FakeDiscord().start())

    def call(self, make: Callable[[], Awaitable[T]]) -> T:
        async def run() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)

    def stop(self) -> None:
        self.call(self.fake.stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
