"""A fake Telegram Bot API: a real aiohttp server on a loopback port, run in a thread.

It speaks the Bot API's JSON (``{"ok": true, "result": ...}`` and ``{"ok": false,
"error_code", "description", "parameters": {"retry_after"}}``) at ``/bot<token>/<method>``
for getMe, getUpdates (long polling with ``offset`` confirmation; the older of two
concurrent polls is answered 409 Conflict, as Telegram does), sendMessage,
editMessageText ("message is not modified" like the real one), sendChatAction,
deleteWebhook, setWebhook and answerCallbackQuery. Like the real one it keeps each
message's inline keyboard (``reply_markup``; an edit without one takes it away), turns a
press into a ``callback_query`` update (``press``), refuses callback_data over 64 bytes,
and parses ``parse_mode=HTML`` text as Telegram does: an unsupported tag, an unclosed or
crossed one, or a stray ``<``/``&`` is a 400 "can't parse entities", and the 4,096 limit
counts the text after parsing. Tests queue user messages, inject failures and read back
every message the bot sent, as it was last edited.
"""

from __future__ import annotations

import asyncio
import html
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

TOKEN = "123456:TEST-token"


@dataclass
class Sent:
    chat_id: str
    message_id: int
    text: str
    thread_id: int | None = None
    edits: int = 0
    at: float = field(default_factory=time.time)
    reply_markup: dict[str, Any] | None = None
    parse_mode: str | None = None


_TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "code", "pre", "a"}
_TAGS |= {"tg-spoiler", "span", "blockquote", "tg-emoji"}
_TOKEN = re.compile(
    r"<(/?)([a-zA-Z][a-zA-Z0-9-]*)((?:\s+[^<>]*)?)>|<|&(#\d+|#x[0-9a-fA-F]+|\w+);|&"
)
_ENTITIES = {"lt", "gt", "amp", "quot"}


def parse_html(text: str) -> str:
    """The visible text of ``text`` in Telegram's HTML mode; ValueError ("can't parse
    entities: ...") where Telegram refuses it."""
    stack: list[str] = []
    visible: list[str] = []
    at = 0
    for m in _TOKEN.finditer(text):
        visible.append(text[at : m.start()])
        at = m.end()
        token = m.group(0)
        if m.group(2):
            closing, tag = m.group(1) == "/", m.group(2).lower()
            if tag not in _TAGS:
                raise ValueError(f'can\'t parse entities: Unsupported start tag "{tag}"')
            if closing:
                if not stack or stack[-1] != tag:
                    raise ValueError(f'can\'t parse entities: Unmatched end tag "{tag}"')
                stack.pop()
            else:
                stack.append(tag)
        elif token == "<":
            raise ValueError("can't parse entities: Unsupported start tag")
        elif token == "&":
            raise ValueError("can't parse entities: Character entity expected")
        else:
            name = m.group(4)
            if not name.startswith("#") and name not in _ENTITIES:
                raise ValueError(f'can\'t parse entities: Unsupported entity "{name}"')
            visible.append(html.unescape(token))
    visible.append(text[at:])
    if stack:
        raise ValueError(
            f"can't parse entities: Can't find end tag corresponding to \"{stack[-1]}\""
        )
    return "".join(visible)


class FakeBotApi:
    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self._lock = threading.Lock()
        self.updates: list[dict[str, Any]] = []
        self._next_update = 1000
        self._next_message = 1
        self.sent: list[Sent] = []
        self.calls: list[tuple[str, dict[str, Any], float]] = []
        self.actions: list[tuple[str, str]] = []
        self.handed_out: list[int] = []
        # id(update) -> the id the server really gave an update queued by ``raw_update``
        self._true_ids: dict[int, int] = {}
        # method -> list of (error_code, description, retry_after, when_text) answered in
        # turn by the next call (whose text contains when_text, when that is given)
        self.failures: dict[str, list[tuple[int, str, float | None, str | None]]] = {}
        self.failed: list[tuple[str, int, float]] = []
        self.blocked: set[str] = set()
        self.webhook: dict[str, Any] | None = None
        self.callback_answers: list[dict[str, Any]] = []
        # While set, sendMessage calls wait; with ``discard_held`` they then fail unrecorded
        # (their client was killed meanwhile: the message never reached the chat).
        self.hold_sends = threading.Event()
        self.discard_held = False
        self.held = 0
        # getUpdates calls so far; a call still waiting when a newer one comes is answered
        # 409 (counted in ``conflicts``), as Telegram answers two pollers of one token.
        self._polls = 0
        self.conflicts = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ----------------------------------------------------------------- test side

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def message(
        self, text: str, *, user_id: int = 42, chat_id: int | None = None, **extra: Any
    ) -> int:
        """Queue a user's text message; returns its update id."""
        with self._lock:
            self._next_update += 1
            update_id = self._next_update
            chat = chat_id if chat_id is not None else user_id
            self.updates.append(
                {
                    "update_id": update_id,
                    "message": {
                        "message_id": update_id,
                        "date": int(time.time()),
                        "chat": {
                            "id": chat,
                            "type": "private" if chat == user_id else "supergroup",
                        },
                        "from": {"id": user_id, "is_bot": False, "first_name": f"user{user_id}"},
                        "text": text,
                        **extra,
                    },
                }
            )
        return update_id

    def press(
        self, message_id: int, data: str, *, user_id: int = 42, chat_id: int | None = None
    ) -> int:
        """Queue a press of the button ``data`` on the bot's message ``message_id`` (a
        ``callback_query`` update, as Telegram sends it); returns its update id."""
        chat = chat_id if chat_id is not None else user_id
        with self._lock:
            sent = next(
                (m for m in self.sent if m.message_id == message_id and m.chat_id == str(chat)),
                None,
            )
            self._next_update += 1
            update_id = self._next_update
            self.updates.append(
                {
                    "update_id": update_id,
                    "callback_query": {
                        "id": f"cbq{update_id}",
                        "from": {"id": user_id, "is_bot": False, "first_name": f"user{user_id}"},
                        "message": {
                            "message_id": message_id,
                            "date": int(time.time()),
                            "chat": {
                                "id": chat,
                                "type": "private" if chat == user_id else "supergroup",
                            },
                            "text": sent.text if sent is not None else "",
                        },
                        "chat_instance": str(chat),
                        "data": data,
                    },
                }
            )
        return update_id

    def keyboards_to(self, chat_id: int | str) -> list[Sent]:
        """The bot's messages to ``chat_id`` that carry an inline keyboard now."""
        return [m for m in self.messages_to(chat_id) if m.reply_markup]

    def raw_update(self, update: dict[str, Any]) -> int:
        """Queue ``update`` as given, like a broken or hostile Bot API server (a relay, a
        self-hosted server) might send it: its ``update_id`` may be out of range, a string,
        a float or missing. The server still knows the id it really gave it (returned) and
        confirms it by that, as Telegram does: an offset past a later update confirms it."""
        with self._lock:
            self._next_update += 1
            self._true_ids[id(update)] = self._next_update
            self.updates.append(update)
            return self._next_update

    def _true_id(self, update: dict[str, Any]) -> int:
        return self._true_ids.get(id(update), update.get("update_id", 0))

    def fail(
        self,
        method: str,
        code: int,
        description: str,
        retry_after: float | None = None,
        *,
        when_text: str | None = None,
    ) -> None:
        with self._lock:
            self.failures.setdefault(method, []).append((code, description, retry_after, when_text))

    def messages_to(self, chat_id: int | str) -> list[Sent]:
        with self._lock:
            return [s for s in self.sent if s.chat_id == str(chat_id)]

    def texts_to(self, chat_id: int | str) -> list[str]:
        return [s.text for s in self.messages_to(chat_id)]

    def calls_of(self, method: str) -> list[dict[str, Any]]:
        with self._lock:
            return [params for name, params, _ in self.calls if name == method]

    # ----------------------------------------------------------------- server side

    def _error(self, code: int, description: str, retry_after: float | None = None) -> web.Response:
        body: dict[str, Any] = {"ok": False, "error_code": code, "description": description}
        if retry_after is not None:
            body["parameters"] = {"retry_after": retry_after}
        return web.json_response(body, status=code)

    async def _handle(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return self._error(401, "Unauthorized")
        method = request.match_info["method"]
        try:
            params = await request.json() if request.can_read_body else {}
        except ValueError:
            params = {}
        with self._lock:
            self.calls.append((method, params, time.time()))
            queued = self.failures.get(method)
            failure = None
            if queued and (queued[0][3] is None or queued[0][3] in str(params.get("text"))):
                failure = queued.pop(0)
            if failure is not None:
                self.failed.append((method, failure[0], time.time()))
        if failure is not None:
            return self._error(*failure[:3])
        handler = getattr(self, f"_m_{method}", None)
        if handler is None:
            return self._error(404, "Not Found: method not found")
        result = await handler(params)
        if isinstance(result, web.Response):
            return result
        return web.json_response({"ok": True, "result": result})

    async def _m_getMe(self, params: dict[str, Any]) -> Any:
        return {"id": int(self.token.split(":")[0]), "is_bot": True, "username": "reveille_bot"}

    async def _m_getUpdates(self, params: dict[str, Any]) -> Any:
        offset = params.get("offset")
        # Capped short, so that stopping the fake never waits for a long poll.
        deadline = time.monotonic() + min(float(params.get("timeout") or 0), 1.0)
        with self._lock:
            self._polls += 1
            mine = self._polls
        while True:
            with self._lock:
                if self._polls != mine:
                    # Like Telegram: a newer getUpdates ends the older one still waiting.
                    self.conflicts += 1
                    return self._error(
                        409,
                        "Conflict: terminated by other getUpdates request; make sure that "
                        "only one bot instance is running",
                    )
                if isinstance(offset, int):
                    # Like Telegram: an offset confirms every update before it.
                    kept = [u for u in self.updates if self._true_id(u) >= offset]
                    for gone in self.updates:
                        if not any(gone is k for k in kept):
                            self._true_ids.pop(id(gone), None)
                    self.updates = kept
                ready = list(self.updates)
                if ready:
                    self.handed_out.extend(self._true_id(u) for u in ready)
                    return ready
            if time.monotonic() >= deadline:
                return []
            await asyncio.sleep(0.02)

    def _chat_gone(self, chat_id: str) -> web.Response | None:
        if chat_id in self.blocked:
            return self._error(403, "Forbidden: bot was blocked by the user")
        return None

    async def _m_sendMessage(self, params: dict[str, Any]) -> Any:
        if self.hold_sends.is_set():
            with self._lock:
                self.held += 1
            while self.hold_sends.is_set():
                await asyncio.sleep(0.02)
            if self.discard_held:
                return self._error(500, "Internal Server Error: client went away")
        chat_id = str(params.get("chat_id"))
        gone = self._chat_gone(chat_id)
        if gone is not None:
            return gone
        text = params.get("text")
        if not isinstance(text, str) or not text:
            return self._error(400, "Bad Request: message text is empty")
        refused = self._check_text(params)
        if refused is not None:
            return refused
        with self._lock:
            message_id = self._next_message
            self._next_message += 1
            self.sent.append(
                Sent(
                    chat_id,
                    message_id,
                    text,
                    params.get("message_thread_id"),
                    reply_markup=params.get("reply_markup"),
                    parse_mode=params.get("parse_mode"),
                )
            )
        return {"message_id": message_id, "chat": {"id": params.get("chat_id")}, "text": text}

    def _check_text(self, params: dict[str, Any]) -> web.Response | None:
        """Telegram's checks of a message's text and keyboard."""
        text = str(params.get("text") or "")
        visible = text
        if params.get("parse_mode") == "HTML":
            try:
                visible = parse_html(text)
            except ValueError as exc:
                return self._error(400, f"Bad Request: {exc}")
        if len(visible) > 4096:
            return self._error(400, "Bad Request: message is too long")
        markup = params.get("reply_markup")
        if markup is not None:
            rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
            if not isinstance(rows, list):
                return self._error(400, "Bad Request: can't parse reply keyboard markup JSON")
            for row in rows:
                for button in row:
                    data = button.get("callback_data")
                    if data is not None and len(str(data).encode()) > 64:
                        return self._error(400, "Bad Request: BUTTON_DATA_INVALID")
        return None

    async def _m_editMessageText(self, params: dict[str, Any]) -> Any:
        chat_id = str(params.get("chat_id"))
        gone = self._chat_gone(chat_id)
        if gone is not None:
            return gone
        text = params.get("text")
        refused = self._check_text(params)
        if refused is not None:
            return refused
        with self._lock:
            for sent in self.sent:
                if sent.chat_id == chat_id and sent.message_id == params.get("message_id"):
                    markup = params.get("reply_markup")
                    if sent.text == text and sent.reply_markup == markup:
                        return self._error(
                            400,
                            "Bad Request: message is not modified: specified new message "
                            "content and reply markup are exactly the same",
                        )
                    sent.text = str(text)
                    sent.reply_markup = markup  # an edit without one takes the keyboard away
                    sent.parse_mode = params.get("parse_mode")
                    sent.edits += 1
                    return {"message_id": sent.message_id, "text": text}
        return self._error(400, "Bad Request: message to edit not found")

    async def _m_sendChatAction(self, params: dict[str, Any]) -> Any:
        chat_id = str(params.get("chat_id"))
        gone = self._chat_gone(chat_id)
        if gone is not None:
            return gone
        with self._lock:
            self.actions.append((chat_id, str(params.get("action"))))
        return True

    async def _m_answerCallbackQuery(self, params: dict[str, Any]) -> Any:
        with self._lock:
            if any(
                a.get("callback_query_id") == params.get("callback_query_id")
                for a in self.callback_answers
            ):
                return self._error(
                    400,
                    "Bad Request: query is too old and response timeout expired or query ID "
                    "is invalid",
                )
            self.callback_answers.append(dict(params))
        return True

    def answers(self) -> list[str]:
        """The texts of the callback query answers, in order."""
        with self._lock:
            return [str(a.get("text") or "") for a in self.callback_answers]

    async def _m_deleteWebhook(self, params: dict[str, Any]) -> Any:
        self.webhook = None
        return True

    async def _m_setWebhook(self, params: dict[str, Any]) -> Any:
        self.webhook = dict(params)
        return True

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> FakeBotApi:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.router.add_post("/bot{token}/{method}", self._handle)
            app.router.add_get("/bot{token}/{method}", self._handle)
            runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            self._runner = runner
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True, name="fake-bot-api")
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
