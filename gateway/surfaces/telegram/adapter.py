"""The Telegram adapter: a push-capable chat surface over the Bot API, implementing the
surface port (``gateway.surfaces.port.ChatSurface``). What is Telegram's lives here and in its
package (intake, the Bot API client, formatting and splitting, the inline keyboard); what
every chat platform does the same way (answering a message once, streaming the reply, the
wake-up rules, who may answer an approval) is ``gateway.surfaces.chat.ChatTurns`` and
``gateway.surfaces.approval_press``, which this adapter uses.

Started by ``reveille serve`` when a bot token is configured (the composition root builds
it with a ``TurnService`` of ``Platform.TELEGRAM``). Each chat, and each forum topic of a
chat, is one session: its id is ``build_session_key`` of the chat's ``SessionSource``.

* Intake (``gateway.surfaces.telegram.intake``): long polling or a webhook, both into the
  durable inbox of ``TelegramState``; updates of one chat are answered in order, chats in
  parallel. Only users in ``allowed_users`` get a turn; anyone else's message is answered
  with nothing at all (it is logged and marked done). With nobody allowed the bot answers
  nobody, and says so in the log at start.
* A turn runs under the idempotency key of its update, so after a crash the update is
  answered from the stored turn instead of running the agent again (see
  ``gateway.surfaces.telegram.state``).
* Replies stream into the chat by editing one message, at most one edit per
  ``edit_interval`` seconds ("message is not modified" counts as success), with the typing
  action while the agent works; the final text is split at Telegram's 4,096-character limit
  on paragraph boundaries and its markdown sent as Telegram HTML (``format``,
  always well-formed; a piece Telegram still cannot parse is sent again as plain text), so
  model output can never break a message.
* ``/start`` and ``/help`` answer with what the bot does, ``/timers`` what is scheduled
  (``gateway.surfaces.timers``); ``/new`` starts a fresh session
  for the chat (``TelegramState.chat_session``): the old one stays readable and its late
  results still come home to it; ``/stop`` cancels the chat's running background work
  (``delivery.cancel``) and says what it stopped.
* Approvals (when the shell asks them): a command the agent wants to run is asked in the
  chat with an inline keyboard (Approve once / Deny) whose ``callback_data`` carries the
  approval's opaque id only. Only an allowed user who owns the chat (the private chat's
  user, or the user who started the group's session) may answer; anyone else's press gets
  "not yours". A press decides once in the store (a second: "already decided"); the turn
  waits meanwhile, holding the chat and its session (wake-ups wait behind it). Pending
  approvals live in the store: after a crash the unanswered message is asked again, and a
  press on the old keyboard, whose turn is gone, is told it was settled as denied ("expired"
  when no turn has taken the session over yet); nothing of it runs.
* Wake-ups arrive through ``deliver_wake``'s push path (``handle_message`` with an internal
  ``MessageEvent``) and are ``ChatTurns.wake``'s: an agent turn that restates the result,
  keyed by the delivery id, sent to the chat, under the rules every platform shares.
* Bot API failures become the port's ``SurfaceError`` (``surface_error``): 429 ->
  ``RATE_LIMITED`` with its ``retry_after``; 5xx and connection failures -> ``TRANSIENT``;
  403 (blocked, kicked) and 400 "chat not found" -> ``GONE`` (a wake-up to it is dropped,
  the result stays in the ledger); any other 400 -> ``REFUSED``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from agent.messages import JSONObject, JSONValue
from delivery.cancel import CANCELLED, BackgroundUnit, active_units
from gateway.adapter import BasePlatformAdapter, MessageEvent
from gateway.approvals import ApprovalRecord, Approvals
from gateway.config import Platform
from gateway.session import SessionSource, build_session_key, is_valid_session_id
from gateway.surfaces.chat import ChatTurns
from gateway.surfaces.port import Refusal, SplitSend, SurfaceError, SurfaceLimits
from gateway.surfaces.telegram.api import TelegramApi, TelegramError, thread_params
from gateway.surfaces.telegram.approvals import ApprovalKeyboard
from gateway.surfaces.telegram.format import MAX_MESSAGE_LENGTH, split_message, to_html
from gateway.surfaces.telegram.intake import LongPoller, SharedIntake, webhook_handler
from gateway.surfaces.telegram.state import TelegramState
from gateway.surfaces.telegram.updates import BadField, telegram_id
from gateway.surfaces.timers import timers_text
from gateway.tasks import finish_or_cancel
from gateway.turns.service import TurnService
from tools.delegation_runtime import get_runtime

__all__ = ["TelegramAdapter", "source_of_message", "telegram_session_id"]

logger = logging.getLogger(__name__)

_MAX_UPDATE_RETRY_SECONDS = 60.0


def telegram_session_id(source: SessionSource) -> str:
    """The session of a chat (or forum topic): its routing key, which is a valid id."""
    key = build_session_key(source)
    if not is_valid_session_id(key):  # numeric Telegram ids never trip this; be safe anyway
        key = "telegram_" + hashlib.sha256(key.encode()).hexdigest()[:32]
    return key


def source_of_message(message: JSONObject) -> SessionSource | None:
    """The ``SessionSource`` of a Bot API ``Message``; None when it has no chat. ``BadField``
    when an id it names (chat, sender, forum topic) is not an integer Telegram gives: a
    topic id like "general" used to reach ``int()`` as a ValueError traceback."""
    chat = message.get("chat")
    if not isinstance(chat, dict) or chat.get("id") is None:
        return None
    chat_id = telegram_id(chat["id"], "chat id", required=True)
    raw_sender = message.get("from")
    sender: JSONObject = raw_sender if isinstance(raw_sender, dict) else {}
    user_id = telegram_id(sender.get("id"), "sender id")
    kind = str(chat.get("type") or "private")
    thread = message.get("message_thread_id") if message.get("is_topic_message") else None
    thread_id = telegram_id(thread, "forum topic id")
    return SessionSource(
        platform=Platform.TELEGRAM,
        chat_id=str(chat_id),
        chat_type="dm" if kind == "private" else kind,
        user_id=str(user_id) if user_id is not None else None,
        user_name=_text(sender.get("username")) or _text(sender.get("first_name")),
        thread_id=str(thread_id) if thread_id is not None else None,
        chat_name=_text(chat.get("title")) or _text(chat.get("username")),
    )


def _text(value: JSONValue) -> str | None:
    return value if isinstance(value, str) else None


HELP_TEXT = (
    "I am Reveille: an agent whose background work comes home.\n\n"
    "Write to me as you would to anyone. Ask for something long 'in the background' and "
    "go on talking: when the work is done, its result comes back here as a new message.\n\n"
    "/new starts a fresh conversation (the old one is kept).\n"
    "/stop stops what this chat has running in the background.\n"
    "/timers lists the reminders and schedules of this chat.\n"
    "/help shows this again."
)


def _command(text: str) -> str | None:
    """The bot command a message opens with (``/Start@my_bot now`` -> ``start``), or None."""
    head = text.strip().split(maxsplit=1)[0] if text.strip() else ""
    if not head.startswith("/") or len(head) < 2:
        return None
    return head[1:].split("@", 1)[0].lower()


class TelegramAdapter(SplitSend, BasePlatformAdapter):
    """See the module docstring."""

    platform = Platform.TELEGRAM
    supports_async_delivery = True

    def __init__(
        self,
        *,
        api: TelegramApi,
        turns: TurnService,
        state: TelegramState,
        allowed_users: frozenset[str] = frozenset(),
        webhook_url: str = "",
        secret_token: str = "",
        poll_timeout: int = 25,
        edit_interval: float = 1.5,
        wake_wait_seconds: float = 240.0,
        poll_backoff_seconds: float = 1.0,
        approvals: Approvals | None = None,
    ) -> None:
        super().__init__()
        if webhook_url and not secret_token:
            raise ValueError(
                "Telegram webhook mode needs [telegram] secret_token: without it anyone who "
                "finds the URL could post updates as any user"
            )
        self.api = api
        self.turns = turns
        self.state = state
        self.allowed_users = frozenset(str(u).strip() for u in allowed_users if str(u).strip())
        self.webhook_url = webhook_url
        self.secret_token = secret_token
        self.limits = SurfaceLimits(
            max_message_chars=MAX_MESSAGE_LENGTH, can_edit=True, edit_interval=edit_interval
        )
        self.bot = api.bot_id
        self.poller = LongPoller(
            api,
            state,
            self._dispatch,
            timeout=poll_timeout,
            backoff_seconds=poll_backoff_seconds,
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._poll_task: asyncio.Task[None] | None = None
        self._in_hand: set[int] = set()  # updates dispatched and not yet answered
        self.ignored_updates = 0
        # Answering once, streaming, and the wake-up rules: the same for every platform.
        self.chat = ChatTurns(
            self,
            turns,
            state,
            key_prefix=f"telegram:{self.bot}",
            wake_wait_seconds=wake_wait_seconds,
        )
        self.approval_keyboard = ApprovalKeyboard(
            self, api, turns.store, approvals, self.allowed_users, self.chat.sources
        )
        if approvals is not None:
            turns.on_approval = self.ask_approval
        self.set_message_handler(self._on_event)

    # ----------------------------------------------------------------- lifecycle

    def webhook_route(self) -> tuple[str, Callable[[web.Request], Awaitable[web.Response]]]:
        """The path (from ``webhook_url``) and handler to mount on the API server's app."""
        path = urlsplit(self.webhook_url).path or "/telegram/webhook"
        return path, webhook_handler(self.state, self.bot, self.secret_token, self._dispatch)

    async def start(self) -> None:
        if not self.allowed_users:
            logger.warning(
                "Telegram: no allowed users configured (TELEGRAM_ALLOWED_USERS); the bot "
                "answers nobody"
            )
        else:
            logger.info("Telegram: allowed users: %s", ", ".join(sorted(self.allowed_users)))
        await asyncio.to_thread(self.state.prune)
        # Updates a previous run (or a dead server) took but did not answer come first.
        for update_id, update in await asyncio.to_thread(self.state.claim_orphans, self.bot):
            self._dispatch(update_id, update)
        self._poll_task = asyncio.create_task(self._intake(), name="telegram-intake")

    async def _intake(self) -> None:
        if self.webhook_url:
            await self._retrying(
                "setWebhook",
                {
                    "url": self.webhook_url,
                    "secret_token": self.secret_token,
                    "allowed_updates": ["message", "callback_query"],
                },
            )
            logger.info("Telegram: webhook mode at %s", self.webhook_url)
            await SharedIntake(self.state, self.bot, self._dispatch, in_hand=self._in_hand).run()
            return
        # Polling and a webhook exclude each other; updates queued meanwhile are kept.
        await self._retrying("deleteWebhook", {"drop_pending_updates": False})
        # Polls only while it holds the polling lease (one server of those sharing the bot).
        await SharedIntake(
            self.state, self.bot, self._dispatch, self.poller, in_hand=self._in_hand
        ).run()

    async def _retrying(self, method: str, params: JSONObject) -> Any:
        delay = 1.0
        while True:
            try:
                return await self.api.call(method, params)
            except TelegramError as exc:
                logger.warning("Telegram %s failed (%s); retrying in %.0f s", method, exc, delay)
                await asyncio.sleep(exc.retry_after or delay)
                delay = min(delay * 2, _MAX_UPDATE_RETRY_SECONDS)

    async def stop(self, *, grace_seconds: float = 10.0) -> None:
        if self._poll_task is not None:
            self._poll_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._poll_task
            self._poll_task = None
        # Handed over at once: a server standing by polls from its next tick.
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.state.release_poll_lease, self.bot)
        await finish_or_cancel(self._tasks, grace_seconds)
        await self.turns.drain(grace_seconds)
        await self.api.close()

    # ----------------------------------------------------------------- user updates

    def _dispatch(self, update_id: int, update: JSONObject) -> None:
        if update_id in self._in_hand:
            return  # handed out twice (the intake and a takeover): answered once
        self._in_hand.add(update_id)
        task = asyncio.create_task(self._process_update(update_id, update))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # Once it is marked answered (or left to a takeover, when cancelled).
        task.add_done_callback(lambda _: self._in_hand.discard(update_id))

    async def _process_update(self, update_id: int, update: JSONObject) -> None:
        try:
            await self._answer_update(update_id, update)
        except asyncio.CancelledError:
            raise  # left unanswered in the inbox: the next start answers it
        except Exception:
            logger.exception("Telegram update %s could not be answered; dropped", update_id)
        await asyncio.to_thread(self.state.mark_answered, self.bot, update_id)

    async def _answer_update(self, update_id: int, update: JSONObject) -> None:
        query = update.get("callback_query")
        if isinstance(query, dict):
            # Never behind the chat's lock: the turn holding it waits for this very press.
            await self.approval_keyboard.on_press(query)
            return
        message = update.get("message")
        if not isinstance(message, dict):
            return
        text = message.get("text")
        try:
            source = source_of_message(message)
        except BadField as exc:
            logger.warning("Telegram update %s skipped: %s", update_id, exc)
            return
        if not isinstance(text, str) or not text.strip() or source is None:
            return
        if source.user_id is None or source.user_id not in self.allowed_users:
            self.ignored_updates += 1
            logger.info(
                "Telegram: ignoring a message from user %s (not in TELEGRAM_ALLOWED_USERS)",
                source.user_id,
            )
            return
        command = _command(text)
        if command in ("start", "help", "new", "stop", "timers"):
            # Answered by the bot itself: no turn, nothing stored.
            try:
                if command == "new":
                    await self._new_session(source)
                elif command == "stop":
                    await self._stop_background(source)
                elif command == "timers":
                    session_id = await self._session_of(source)
                    await self.send_text(source, await asyncio.to_thread(timers_text, session_id))
                else:
                    await self.send_text(source, HELP_TEXT)
            except SurfaceError as exc:
                logger.warning("Telegram refused the answer to update %s: %s", update_id, exc)
            return
        session_id = await self._session_of(source)
        key = f"telegram:{self.bot}:update:{update_id}"
        event = MessageEvent(
            text=text,
            source=source,
            session_id=session_id,
            message_id=str(message.get("message_id") or update_id),
        )
        await self.chat.answer_message(event, key=key)

    # ----------------------------------------------------------------- conversations

    async def _session_of(self, source: SessionSource) -> str:
        """The session the chat's messages go to now (``/new`` may have moved it)."""
        base = telegram_session_id(source)
        chosen = await asyncio.to_thread(self.state.chat_session, base)
        return chosen or base

    async def _new_session(self, source: SessionSource) -> None:
        base = telegram_session_id(source)
        old = await self._session_of(source)
        fresh = f"{base}:new-{secrets.token_hex(4)}"
        if not is_valid_session_id(fresh):
            fresh = "telegram_" + hashlib.sha256(fresh.encode()).hexdigest()[:32]
        # Only the mapping changes: the old session stays as it is, readable, and what it
        # started still comes home to it.
        await asyncio.to_thread(self.state.start_chat_session, base, fresh)
        await self.send_text(
            source,
            "Started a new conversation: I no longer see what we said before. The previous "
            f"one is kept (session `{old}`).",
        )

    async def _stop_background(self, source: SessionSource) -> None:
        """``/stop``: cancel the chat's queued and running background units and say which.
        Each one's conversation notice (one per unit) comes home like any result."""
        session_id = await self._session_of(source)
        who = f"{source.user_name or source.user_id} on Telegram"

        def stop_all() -> list[BackgroundUnit]:
            runtime = get_runtime()
            units = active_units(runtime.ledger.views, time.time(), session=session_id)
            return [u for u in units if runtime.cancel(u.id, by=who).status == CANCELLED]

        stopped = await asyncio.to_thread(stop_all)
        if not stopped:
            await self.send_text(source, "Nothing is running in the background here.")
            return
        lines = [f"• {u.goal or u.id}" for u in stopped]
        noun = "task" if len(stopped) == 1 else "tasks"
        await self.send_text(
            source, f"Stopped {len(stopped)} background {noun}:\n" + "\n".join(lines)
        )

    # ----------------------------------------------------------------- wake-ups

    async def _on_event(self, event: MessageEvent) -> str | None:
        """An internal event (a wake-up from ``deliver_wake``): ``ChatTurns.wake``, under
        the wake-up rules every platform shares."""
        if event.source is not None and not event.session_id:
            event.session_id = telegram_session_id(event.source)
        return await self.chat.wake(event)

    # ----------------------------------------------------------------- the port

    def split(self, text: str) -> list[str]:
        return split_message(text)

    def owner_of(self, source: SessionSource) -> str | None:
        """A private chat's user; in a group, the user who started the session."""
        return source.user_id or source.chat_id

    async def ask_approval(self, approval: ApprovalRecord) -> None:
        await self.approval_keyboard.ask(approval)

    async def typing(self, to: SessionSource) -> None:
        with contextlib.suppress(TelegramError):
            await self.api.call(
                "sendChatAction",
                {"chat_id": to.chat_id, "action": "typing", **thread_params(to)},
            )

    # ----------------------------------------------------------------- sending

    async def send_text(self, to: SessionSource, text: str, *, edit: int | None = None) -> int:
        """Send (or, with ``edit``, edit to) one piece of markdown; its message id."""
        try:
            if edit is None:
                result = await self._formatted(
                    "sendMessage", {"chat_id": to.chat_id, **thread_params(to)}, text
                )
                return int(result["message_id"]) if isinstance(result, dict) else 0
            try:
                await self._formatted(
                    "editMessageText", {"chat_id": to.chat_id, "message_id": edit}, text
                )
            except TelegramError as exc:
                if not exc.not_modified:
                    raise
            return edit
        except TelegramError as exc:
            raise surface_error(exc) from exc

    async def _formatted(self, method: str, params: JSONObject, text: str) -> Any:
        """``text`` as Telegram HTML; as plain text when Telegram cannot parse it anyway."""
        try:
            return await self.api.call(
                method, {**params, "text": to_html(text), "parse_mode": "HTML"}
            )
        except TelegramError as exc:
            if exc.error_code != 400 or "can't parse entities" not in exc.description.lower():
                raise
            logger.info("Telegram could not parse a reply's HTML (%s); sent as plain text", exc)
            return await self.api.call(method, {**params, "text": text})


def surface_error(exc: TelegramError) -> SurfaceError:
    """A Bot API failure in the port's terms (``TelegramError`` classifies it)."""
    if exc.gone:
        kind = Refusal.GONE
    elif exc.error_code == 429:
        kind = Refusal.RATE_LIMITED
    elif exc.transient:
        kind = Refusal.TRANSIENT
    else:
        kind = Refusal.REFUSED
    return SurfaceError(
        exc.description, kind=kind, retry_after=exc.retry_after, code=exc.error_code
    )
