"""Matrix in the contract suite: ``FakePlatform`` over a real Synapse (a "fake" in name only:
it drives real Synapse users, ``tests/matrix/synapse.py``).

Each instance registers a bot, an owner and another user, and gives each user a direct room
with the bot (invited before the bot starts: its first sync joins them). The bot talks to
Synapse through a small loopback proxy (``MatrixProxy``, on a loop of its own thread) that
passes everything on, except what a test asks it to do to the bot's messages: hold them
(and then lose them), refuse one with ``M_LIMIT_EXCEEDED`` and a ``retry_after_ms``, or
refuse every message to a room with ``M_FORBIDDEN`` (the bot was kicked: "blocked").

What the users see is read from Synapse itself: the bot's ``m.text`` messages in a room, as
last replaced (``m.replace``); approval questions are its messages that still ask for a
reaction, pressed by reacting ✅ or ❌; what a presser was told is the bot's notices in reply
to a question.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any
from urllib.parse import quote, unquote

import aiohttp
from aiohttp import web

from gateway.config import Platform
from gateway.session import SessionSource
from gateway.surfaces.matrix.adapter import APPROVE_KEY, DENY_KEY
from gateway.surfaces.matrix.intake import matrix_session_id, room_source
from tests.matrix.synapse import MATRIX_URL, Json, register, require_matrix
from tests.surfaces.contract import Button


class MatrixProxy:
    """A loopback HTTP proxy in front of Synapse (see the module docstring)."""

    def __init__(self, upstream: str, bot_token: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.bot_token = bot_token
        self.holding = False
        self.discard_held = False
        self.held = 0
        self.typing = 0
        self.blocked: set[str] = set()  # room ids
        self.limit: tuple[str, float] | None = None  # (text, retry_after seconds)
        self.rate_limited: list[float] = []
        self.sync_limit: float | None = None  # refuse the bot's next /sync, this long
        self.syncs: list[float] = []  # when each /sync of the bot arrived
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.started.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self.started.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _refuse(self, status: int, errcode: str, **extra: object) -> web.Response:
        body = {"errcode": errcode, "error": errcode.lower(), **extra}
        return web.json_response(body, status=status)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        by_bot = request.headers.get("Authorization") == f"Bearer {self.bot_token}"
        if by_bot and request.path.endswith("/sync"):
            self.syncs.append(time.time())
            if self.sync_limit is not None:
                wait, self.sync_limit = self.sync_limit, None
                self.rate_limited.append(time.time())
                return self._refuse(429, "M_LIMIT_EXCEEDED", retry_after_ms=int(wait * 1000))
        if by_bot and request.method == "PUT" and "/typing/" in request.path:
            self.typing += 1
        if by_bot and request.method == "PUT" and "/send/m.room.message/" in request.path:
            room = unquote(request.raw_path.split("/rooms/", 1)[1].split("/", 1)[0])
            if room in self.blocked:
                return self._refuse(403, "M_FORBIDDEN")
            text = body.decode(errors="replace")
            if self.limit is not None and self.limit[0] in json.loads(text).get("body", ""):
                wait = self.limit[1]
                self.limit = None
                self.rate_limited.append(time.time())
                return self._refuse(429, "M_LIMIT_EXCEEDED", retry_after_ms=int(wait * 1000))
            if self.holding:
                self.held += 1
                while self.holding:
                    await asyncio.sleep(0.05)
                if self.discard_held:
                    return self._refuse(502, "M_UNKNOWN")
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
        }
        async with self.session.request(
            request.method,
            self.upstream + request.path_qs,
            data=body if body else None,
            headers=headers,
        ) as upstream:
            data = await upstream.read()
            return web.Response(
                body=data,
                status=upstream.status,
                content_type=upstream.content_type,
            )

    def stop(self) -> None:
        async def close() -> None:
            # Long polls of a stopped bot may still wait upstream: ended, not awaited.
            this = asyncio.current_task()
            for task in asyncio.all_tasks():
                if task is not this:
                    task.cancel()
            await self.runner.cleanup()
            await self.session.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(3)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class MatrixPlatform:
    name = Platform.MATRIX.value
    max_chars = 6000

    def __init__(self) -> None:
        require_matrix()
        self.bot = register("bot")
        self.users = {u.user_id: u for u in (register("owner"), register("other"))}
        self.owner, self.other = list(self.users)
        for user in self.users.values():
            # The bot is in each user's direct room before it starts (the suite's calls of
            # ``say`` may run on the server's own loop, so they cannot wait for a join).
            room = user.direct_room(self.bot.user_id)
            self.bot.call("POST", f"/rooms/{_q(room)}/join", {})
        self.proxy = MatrixProxy(MATRIX_URL, self.bot.token)

    def env(self) -> dict[str, str]:
        return {
            "MATRIX_HOMESERVER": self.proxy.url,
            "MATRIX_USER_ID": self.bot.user_id,
            "MATRIX_ACCESS_TOKEN": self.bot.token,
            "MATRIX_ALLOWED_USERS": f"{self.owner},{self.other}",
        }

    def settings(self) -> dict[str, Any]:
        return {
            "matrix_homeserver": self.proxy.url,
            "matrix_user_id": self.bot.user_id,
            "matrix_access_token": self.bot.token,
            "matrix_allowed_users": f"{self.owner},{self.other}",
        }

    def _room(self, user: str | None) -> str:
        return self.users[user or self.owner].rooms[self.bot.user_id]

    def source(self, user: str) -> SessionSource:
        return room_source(self._room(user), user, 2)

    def session_id(self, user: str) -> str:
        return matrix_session_id(self.source(user))

    def say(self, text: str, *, user: str | None = None) -> None:
        author = self.users[user or self.owner]
        author.say(self._room(author.user_id), text)

    def _bot_events(self, user: str | None) -> list[Json]:
        reader = self.users[user or self.owner]
        events = reader.events(self._room(reader.user_id))
        return [e for e in events if e.get("sender") == self.bot.user_id]

    def _messages(self, user: str | None) -> list[tuple[Json, str]]:
        """The bot's text messages, each with its text as last replaced."""
        events = [e for e in self._bot_events(user) if e.get("type") == "m.room.message"]
        texts: dict[str, str] = {}
        order: list[Json] = []
        for event in events:
            content = event.get("content")
            if not isinstance(content, dict) or content.get("msgtype") != "m.text":
                continue
            relates = content.get("m.relates_to") or {}
            if relates.get("rel_type") == "m.replace":
                texts[str(relates.get("event_id"))] = str(content["m.new_content"]["body"])
                continue
            texts.setdefault(str(event["event_id"]), str(content.get("body") or ""))
            order.append(event)
        return [(e, texts[str(e["event_id"])]) for e in order]

    def replies(self, user: str | None = None) -> list[str]:
        return [text for _, text in self._messages(user)]

    def reply_times(self, user: str | None = None) -> list[float]:
        return [float(e["origin_server_ts"]) / 1000 for e, _ in self._messages(user)]  # type: ignore[arg-type]

    def hold_replies(self) -> None:
        self.proxy.holding = True

    def release_replies(self, *, lost: bool) -> None:
        self.proxy.discard_held = lost
        self.proxy.holding = False

    def held(self) -> int:
        return self.proxy.held

    def taken(self) -> bool:
        return self.proxy.held > 0 or self.proxy.typing > 0

    def rate_limit(self, *, retry_after: float, when_text: str) -> None:
        self.proxy.limit = (when_text, retry_after)

    def rate_limited_at(self) -> list[float]:
        return list(self.proxy.rate_limited)

    def block(self, user: str) -> None:
        self.proxy.blocked.add(self._room(user))

    def buttons(self, user: str | None = None) -> list[Button]:
        return [
            Button(event["event_id"], APPROVE_KEY, DENY_KEY)
            for event, text in self._messages(user)
            if "Approval needed" in text and APPROVE_KEY in text
        ]

    def press(self, button: Button, *, approve: bool, user: str | None = None) -> None:
        presser = self.users[user or self.owner]
        room = self._room(self.owner)
        if presser.user_id != self.owner and presser.user_id not in self.users[self.owner].joined(
            room
        ):
            self.users[self.owner].call(
                "POST", f"/rooms/{_q(room)}/invite", {"user_id": presser.user_id}
            )
            presser.call("POST", f"/rooms/{_q(room)}/join", {})
        presser.react(room, str(button.message), button.approve if approve else button.deny)

    def press_answers(self) -> list[str]:
        answers = []
        for event in self._bot_events(self.owner):
            content = event.get("content")
            if (
                isinstance(content, dict)
                and content.get("msgtype") == "m.notice"
                and "m.in_reply_to" in (content.get("m.relates_to") or {})
            ):
                answers.append(str(content.get("body") or ""))
        return answers

    def stop(self) -> None:
        self.proxy.holding = False
        self.proxy.stop()


def _q(value: str) -> str:
    return quote(value, safe="")
