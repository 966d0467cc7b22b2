"""Slack in the contract suite, and the stand-in the Slack tests talk to: ``FakeSlack``, a real
aiohttp server on loopback (on a loop of its own thread) speaking the Web API and Socket Mode,
and ``SlackPlatform``, the suite's ``FakePlatform`` over it.

``FakeSlack`` speaks what the bot uses:

* Socket Mode's handshake: ``POST apps.connections.open`` (the app-level token) answers a
  ``ws://`` URL; the socket's first message is ``hello``; events and presses are envelopes
  (``events_api``, ``interactive``) the bot acknowledges by ``envelope_id``. An envelope not
  acknowledged when its socket closes is sent again on the next socket (as Slack does), and
  one pushed while no socket is open waits for one. ``disconnect()`` sends Slack's
  ``disconnect`` message (the bot opens a new socket).
* The Web API (the bot token): ``chat.postMessage``, ``chat.update``, ``chat.postEphemeral``,
  ``auth.test``, JSON or form bodies; ``rate_limit`` refuses the next message containing a
  text with HTTP 429 and ``Retry-After``; ``blocked`` channels answer ``channel_not_found``;
  ``holding`` keeps the bot's messages waiting (and, ``discard_held``, fails them).

What users see is the bot's messages as last updated, their mrkdwn read back as text
(``visible``: links as their labels, ``&lt;`` as ``<``...).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from aiohttp import WSMsgType, web

from gateway.config import Platform
from gateway.session import SessionSource
from gateway.surfaces.slack.intake import APPROVE_ACTION, DENY_ACTION, slack_session_id
from tests.surfaces.contract import Button

_LINK = re.compile(r"<([^|>]*)\|([^>]*)>")


def visible(mrkdwn: str) -> str:
    """What a reader sees of ``mrkdwn``: a link's label, entities as their characters."""
    text = _LINK.sub(lambda m: m.group(2), mrkdwn)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def dm_channel(user: str) -> str:
    """The direct message channel of ``user`` with the bot."""
    return "D" + user


@dataclass
class Sent:
    """A message of the bot, as last updated."""

    channel: str
    ts: str
    text: str
    at: float
    thread_ts: str | None = None
    blocks: list[Any] = field(default_factory=list)


class FakeSlack:
    """See the module docstring."""

    def __init__(self) -> None:
        self.bot_token = "xoxb-" + secrets.token_hex(8)
        self.app_token = "xapp-" + secrets.token_hex(8)
        self.signing_secret = secrets.token_hex(16)
        self.sent: list[Sent] = []
        self.ephemeral: list[tuple[str, str]] = []  # (user, text)
        self.holding = False
        self.discard_held = False
        self.held = 0
        self.blocked: set[str] = set()
        self.limit: tuple[str, float] | None = None
        self.rate_limited: list[float] = []
        self.connections_opened = 0
        self.connections_failing = 0  # apps.connections.open answers 503 this many times
        self.hellos = 0
        self.acked: list[str] = []  # envelope ids
        self.acked_types: list[str] = []
        self.ack_payloads: dict[str, Any] = {}  # envelope id: what its ack carried
        self._pending: deque[dict[str, Any]] = deque()
        self._unacked: dict[str, tuple[web.WebSocketResponse, dict[str, Any]]] = {}
        self._sockets: list[web.WebSocketResponse] = []
        self._seq = itertools.count(1)
        self._sends: set[asyncio.Future[None]] = set()
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        started.wait(10)

    # ----------------------------------------------------------------- the server

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        started.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/link/", self._socket)
        app.router.add_post("/api/{method}", self._api)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    def call(self, fn: Any) -> Any:
        """Run ``fn()`` on the server's loop (a coroutine is awaited) and return its result."""

        async def run() -> Any:
            result = fn()
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def push(self, envelope: dict[str, Any]) -> None:
        """Send ``envelope`` on the open socket, or when one opens; never waits."""
        self.loop.call_soon_threadsafe(self._push, envelope)

    def _push(self, envelope: dict[str, Any]) -> None:
        self._pending.append(envelope)
        self._flush()

    def _flush(self) -> None:
        live = [s for s in self._sockets if not s.closed]
        if not live:
            return
        socket = live[-1]
        while self._pending:
            envelope = self._pending.popleft()
            self._unacked[envelope["envelope_id"]] = (socket, envelope)
            task = asyncio.ensure_future(socket.send_str(json.dumps(envelope)))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        await socket.send_str(json.dumps({"type": "hello", "num_connections": 1}))
        self.hellos += 1
        self._sockets.append(socket)
        self._flush()
        try:
            async for message in socket:
                if message.type != WSMsgType.TEXT:
                    continue
                data = json.loads(message.data)
                envelope_id = str(data.get("envelope_id") or "")
                taken = self._unacked.pop(envelope_id, None)
                if taken is not None:
                    self.acked.append(envelope_id)
                    self.acked_types.append(str(taken[1].get("type")))
                    self.ack_payloads[envelope_id] = data.get("payload")
        finally:
            # What this socket did not acknowledge goes out again on the next one.
            for envelope_id, (owner, envelope) in list(self._unacked.items()):
                if owner is socket:
                    del self._unacked[envelope_id]
                    envelope["retry_attempt"] = int(envelope.get("retry_attempt") or 0) + 1
                    self._pending.append(envelope)
        return socket

    def disconnect(self) -> None:
        """Slack asks the bot to open a new socket (``disconnect``, ``refresh_requested``)."""

        async def send() -> None:
            for socket in self._sockets:
                if not socket.closed:
                    await socket.send_str(
                        json.dumps({"type": "disconnect", "reason": "refresh_requested"})
                    )

        self.call(send)

    @staticmethod
    def _answer(status: int = 200, **body: Any) -> web.Response:
        return web.json_response(body, status=status)

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        raw = await request.read()
        if request.content_type == "application/json":
            params: dict[str, Any] = json.loads(raw or b"{}")
        else:
            params = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if method == "apps.connections.open":
            if self.connections_failing > 0:
                self.connections_failing -= 1
                return self._answer(503, ok=False, error="service_unavailable")
            if token != self.app_token:
                return self._answer(ok=False, error="invalid_auth")
            self.connections_opened += 1
            url = f"ws://127.0.0.1:{self.port}/link/?ticket={next(self._seq)}"
            return self._answer(ok=True, url=url)
        if token != self.bot_token:
            return self._answer(ok=False, error="invalid_auth")
        if method == "auth.test":
            return self._answer(ok=True, user_id="UBOT", bot_id="BBOT", team_id="T1")
        if method == "chat.postEphemeral":
            self.ephemeral.append((str(params.get("user")), str(params.get("text") or "")))
            return self._answer(ok=True, message_ts=self._ts())
        if method not in ("chat.postMessage", "chat.update"):
            return self._answer(ok=False, error="unknown_method")
        channel, text = str(params.get("channel") or ""), str(params.get("text") or "")
        blocks = params.get("blocks")
        if isinstance(blocks, str):
            blocks = json.loads(blocks)
        if channel in self.blocked:
            return self._answer(ok=False, error="channel_not_found")
        if self.limit is not None and self.limit[0] in visible(text):
            wait = self.limit[1]
            self.limit = None
            self.rate_limited.append(time.time())
            return web.json_response(
                {"ok": False, "error": "ratelimited"},
                status=429,
                headers={"Retry-After": str(int(wait))},
            )
        if method == "chat.update":
            ts = str(params.get("ts"))
            found = [s for s in self.sent if s.channel == channel and s.ts == ts]
            if not found:
                return self._answer(ok=False, error="message_not_found")
            found[0].text = text
            if blocks is not None:
                found[0].blocks = list(blocks)
            return self._answer(ok=True, channel=channel, ts=ts, text=text)
        if self.holding:
            self.held += 1
            while self.holding:
                await asyncio.sleep(0.05)
            if self.discard_held:
                return self._answer(500, ok=False, error="fatal_error")
        thread = params.get("thread_ts")
        sent = Sent(channel, self._ts(), text, time.time(), str(thread) if thread else None)
        sent.blocks = list(blocks or [])
        self.sent.append(sent)
        return self._answer(ok=True, channel=channel, ts=sent.ts, message={"text": text})

    def _ts(self) -> str:
        return f"{int(time.time())}.{next(self._seq):06d}"

    # ----------------------------------------------------------------- what users do

    def message_envelope(
        self,
        text: str,
        *,
        user: str,
        channel: str | None = None,
        thread_ts: str | None = None,
        kind: str = "message",
        event_id: str | None = None,
    ) -> dict[str, Any]:
        """An ``event_callback`` body of ``user``'s message (by default in their DM)."""
        channel = channel or dm_channel(user)
        event: dict[str, Any] = {
            "type": kind,
            "channel": channel,
            "channel_type": "im" if channel.startswith("D") else "channel",
            "user": user,
            "text": text,
            "ts": self._ts(),
        }
        if thread_ts:
            event["thread_ts"] = thread_ts
        return {
            "type": "event_callback",
            "team_id": "T1",
            "event_id": event_id or "Ev" + secrets.token_hex(6).upper(),
            "event_time": int(time.time()),
            "event": event,
        }

    def say(self, text: str, *, user: str, **where: Any) -> dict[str, Any]:
        """``user`` writes ``text``: an ``events_api`` envelope on the socket."""
        body = self.message_envelope(text, user=user, **where)
        self.push({"envelope_id": secrets.token_hex(8), "type": "events_api", "payload": body})
        return body

    def press_payload(self, sent: Sent, action_id: str, *, by: str) -> dict[str, Any]:
        value = next(
            str(e["value"])
            for b in sent.blocks
            if b.get("type") == "actions"
            for e in b["elements"]
            if e["action_id"] == action_id
        )
        message: dict[str, Any] = {"ts": sent.ts, "text": sent.text}
        if sent.thread_ts:
            message["thread_ts"] = sent.thread_ts
        return {
            "type": "block_actions",
            "user": {"id": by},
            "channel": {"id": sent.channel},
            "message": message,
            "container": {"type": "message", "message_ts": sent.ts},
            "trigger_id": f"{next(self._seq)}.{secrets.token_hex(6)}",
            "actions": [
                {
                    "action_id": action_id,
                    "value": value,
                    "type": "button",
                    "action_ts": f"{time.time():.6f}{next(self._seq)}",
                }
            ],
        }

    def press(self, sent: Sent, action_id: str, *, by: str, times: int = 1) -> None:
        """``by`` presses the button; ``times`` > 1: Slack delivers that one press again (a
        new envelope, the same payload)."""
        payload = self.press_payload(sent, action_id, by=by)
        for _ in range(times):
            envelope = {"envelope_id": secrets.token_hex(8), "type": "interactive"}
            self.push({**envelope, "payload": payload})

    def command(self, text: str, *, user: str, channel: str | None = None) -> str:
        """``user`` types ``/reveille {text}`` (in their direct message by default); the
        envelope's id, whose acknowledgement carries the answer."""
        envelope_id = secrets.token_hex(8)
        payload = {
            "command": "/reveille",
            "text": text,
            "user_id": user,
            "channel_id": channel or dm_channel(user),
            "trigger_id": secrets.token_hex(6),
        }
        self.push({"envelope_id": envelope_id, "type": "slash_commands", "payload": payload})
        return envelope_id

    def messages_to(self, channel: str) -> list[Sent]:
        return [s for s in self.sent if s.channel == channel]

    def stop(self) -> None:
        async def close() -> None:
            for socket in self._sockets:
                with contextlib.suppress(Exception):
                    await socket.close()
            await self.runner.cleanup()

        self.holding = False
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class SlackPlatform:
    """The contract suite's ``FakePlatform`` over ``FakeSlack`` (Socket Mode)."""

    name = Platform.SLACK.value
    owner = "U0OWNER"
    other = "U0OTHER"
    max_chars = 4000

    def __init__(self) -> None:
        self.fake = FakeSlack()

    def env(self) -> dict[str, str]:
        return {
            "SLACK_BOT_TOKEN": self.fake.bot_token,
            "SLACK_APP_TOKEN": self.fake.app_token,
            "SLACK_BASE_URL": self.fake.base_url,
            "SLACK_ALLOWED_USERS": f"{self.owner},{self.other}",
        }

    def settings(self) -> dict[str, Any]:
        return {
            "slack_bot_token": self.fake.bot_token,
            "slack_app_token": self.fake.app_token,
            "slack_base_url": self.fake.base_url,
            "slack_allowed_users": f"{self.owner},{self.other}",
        }

    def source(self, user: str) -> SessionSource:
        return SessionSource(
            platform=Platform.SLACK, chat_id=dm_channel(user), chat_type="dm", user_id=user
        )

    def session_id(self, user: str) -> str:
        return slack_session_id(self.source(user))

    def say(self, text: str, *, user: str | None = None) -> None:
        self.fake.say(text, user=user or self.owner)

    def _sent(self, user: str | None) -> list[Sent]:
        return self.fake.messages_to(dm_channel(user or self.owner))

    def replies(self, user: str | None = None) -> list[str]:
        return [visible(s.text) for s in self._sent(user)]

    def reply_times(self, user: str | None = None) -> list[float]:
        return [s.at for s in self._sent(user)]

    def hold_replies(self) -> None:
        self.fake.holding = True

    def release_replies(self, *, lost: bool) -> None:
        self.fake.discard_held = lost
        self.fake.holding = False

    def held(self) -> int:
        return self.fake.held

    def taken(self) -> bool:
        return "events_api" in self.fake.acked_types

    def rate_limit(self, *, retry_after: float, when_text: str) -> None:
        self.fake.limit = (when_text, retry_after)

    def rate_limited_at(self) -> list[float]:
        return list(self.fake.rate_limited)

    def block(self, user: str) -> None:
        self.fake.blocked.add(dm_channel(user))

    def buttons(self, user: str | None = None) -> list[Button]:
        return [
            Button(s.ts, APPROVE_ACTION, DENY_ACTION)
            for s in self._sent(user)
            if any(b.get("type") == "actions" for b in s.blocks)
        ]

    def press(self, button: Button, *, approve: bool, user: str | None = None) -> None:
        [sent] = [s for s in self.fake.sent if s.ts == button.message]
        self.fake.press(sent, button.approve if approve else button.deny, by=user or self.owner)

    def press_answers(self) -> list[str]:
        return [visible(text) for _, text in self.fake.ephemeral]

    def stop(self) -> None:
        self.fake.stop()
