"""The Telegram adapter: a push-capable chat surface over the Bot API.

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
  on paragraph boundaries and its markdown sent as Telegram HTML (``telegram_format``,
  always well-formed; a piece Telegram still cannot parse is sent again as plain text), so
  model output can never break a message.
* ``/start`` and ``/help`` answer with what the bot does; ``/new`` starts a fresh session
  for the chat (``TelegramState.chat_sessions``): the old one stays readable and its late
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
  ``MessageEvent``): an agent turn that restates the result, keyed by the delivery id, sent
  to the chat. A wake-up for a chat whose turn is running waits for it (the claim is held,
  no attempt is refused or spent) and runs once afterwards.
* Errors map onto the ledger's rules: 429 -> wait ``retry_after``, then a retryable release;
  5xx and connection failures -> retryable; 403 (blocked, kicked) and 400 "chat not found"
  -> ``SessionGone`` (the runner drops the delivery, the result stays in the ledger); any
  other 400 -> an ordinary release.
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

from delivery.cancel import CANCELLED, BackgroundUnit, active_units
from gateway.adapter import BasePlatformAdapter, MessageEvent, SendResult
from gateway.approvals import Approvals
from gateway.config import Platform
from gateway.session import SessionGone, SessionSource, build_session_key, is_valid_session_id
from gateway.surfaces.telegram.api import TelegramApi, TelegramError, thread_params
from gateway.surfaces.telegram.approvals import ApprovalKeyboard
from gateway.surfaces.telegram.format import split_message, to_html
from gateway.surfaces.telegram.intake import LongPoller, webhook_handler
from gateway.surfaces.telegram.state import TelegramState
from gateway.surfaces.telegram.updates import BadField, telegram_id
from gateway.tasks import finish_or_cancel
from gateway.turns.service import ReplayedTurn, TurnError, TurnRequest, TurnService
from gateway.wake import WakeDeliveryError
from tools.delegation_runtime import get_runtime

__all__ = ["TelegramAdapter", "source_of_message", "telegram_session_id"]

logger = logging.getLogger(__name__)

_TYPING_EVERY_SECONDS = 4.0
_MAX_UPDATE_RETRY_SECONDS = 60.0


def telegram_session_id(source: SessionSource) -> str:
    """The session of a chat (or forum topic): its routing key, which is a valid id."""
    key = build_session_key(source)
    if not is_valid_session_id(key):  # numeric Telegram ids never trip this; be safe anyway
        key = "telegram_" + hashlib.sha256(key.encode()).hexdigest()[:32]
    return key


def source_of_message(message: dict[str, Any]) -> SessionSource | None:
    """The ``SessionSource`` of a Bot API ``Message``; None when it has no chat. ``BadField``
    when an id it names (chat, sender, forum topic) is not an integer Telegram gives: a
    topic id like "general" used to reach ``int()`` as a ValueError traceback."""
    chat = message.get("chat")
    if not isinstance(chat, dict) or chat.get("id") is None:
        return None
    chat_id = telegram_id(chat["id"], "chat id", required=True)
    raw_sender = message.get("from")
    sender: dict[str, Any] = raw_sender if isinstance(raw_sender, dict) else {}
    user_id = telegram_id(sender.get("id"), "sender id")
    kind = str(chat.get("type") or "private")
    thread = message.get("message_thread_id") if message.get("is_topic_message") else None
    thread_id = telegram_id(thread, "forum topic id")
    return SessionSource(
        platform=Platform.TELEGRAM,
        chat_id=str(chat_id),
        chat_type="dm" if kind == "private" else kind,
        user_id=str(user_id) if user_id is not None else None,
        user_name=sender.get("username") or sender.get("first_name"),
        thread_id=str(thread_id) if thread_id is not None else None,
        chat_name=chat.get("title") or chat.get("username"),
    )


HELP_TEXT = (
    "I am Reveille: an agent whose background work comes home.\n\n"
    "Write to me as you would to anyone. Ask for something long 'in the background' and "
    "go on talking: when the work is done, its result comes back here as a new message.\n\n"
    "/new starts a fresh conversation (the old one is kept).\n"
    "/stop stops what this chat has running in the background.\n"
    "/help shows this again."
)


def _command(text: str) -> str | None:
    """The bot command a message opens with (``/Start@my_bot now`` -> ``start``), or None."""
    head = text.strip().split(maxsplit=1)[0] if text.strip() else ""
    if not head.startswith("/") or len(head) < 2:
        return None
    return head[1:].split("@", 1)[0].lower()


class TelegramAdapter(BasePlatformAdapter):
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
        self.edit_interval = edit_interval
        self.wake_wait_seconds = wake_wait_seconds
        self.bot = api.bot_id
        self.poller = LongPoller(
            api,
            state,
            self._dispatch,
            timeout=poll_timeout,
            backoff_seconds=poll_backoff_seconds,
        )
        self._chat_locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._poll_task: asyncio.Task[None] | None = None
        self.ignored_updates = 0
        # The chat each running turn's session answers in: where its approvals are asked.
        self._sources: dict[str, SessionSource] = {}
        self.approval_keyboard = ApprovalKeyboard(
            api, turns.store, approvals, self.allowed_users, self._sources
        )
        if approvals is not None:
            turns.on_approval = self.approval_keyboard.ask
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
        # Updates a previous run took but did not answer come first.
        for update_id, update in await asyncio.to_thread(self.state.unanswered, self.bot):
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
            return
        # Polling and a webhook exclude each other; updates queued meanwhile are kept.
        await self._retrying("deleteWebhook", {"drop_pending_updates": False})
        logger.info("Telegram: polling for updates (bot %s)", self.bot)
        await self.poller.run()

    async def _retrying(self, method: str, params: dict[str, Any]) -> Any:
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
        await finish_or_cancel(self._tasks, grace_seconds)
        await self.turns.drain(grace_seconds)
        await self.api.close()

    # ----------------------------------------------------------------- user updates

    def _dispatch(self, update_id: int, update: dict[str, Any]) -> None:
        task = asyncio.create_task(self._process_update(update_id, update))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._chat_locks.get(session_id)
        if lock is None:
            if len(self._chat_locks) > 1024:
                # Forget the locks of idle chats (nobody holds or waits for them).
                for idle in [k for k, v in self._chat_locks.items() if not v.locked()]:
                    del self._chat_locks[idle]
            lock = self._chat_locks[session_id] = asyncio.Lock()
        return lock

    async def _process_update(self, update_id: int, update: dict[str, Any]) -> None:
        try:
            await self._answer_update(update_id, update)
        except asyncio.CancelledError:
            raise  # left unanswered in the inbox: the next start answers it
        except Exception:
            logger.exception("Telegram update %s could not be answered; dropped", update_id)
        await asyncio.to_thread(self.state.mark_answered, self.bot, update_id)

    async def _answer_update(self, update_id: int, update: dict[str, Any]) -> None:
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
        if command in ("start", "help", "new", "stop"):
            # Answered by the bot itself: no turn, nothing stored.
            try:
                if command == "new":
                    await self._new_session(source)
                elif command == "stop":
                    await self._stop_background(source)
                else:
                    await self.send_text(source, HELP_TEXT)
            except TelegramError as exc:
                logger.warning("Telegram refused the answer to update %s: %s", update_id, exc)
            return
        session_id = await self._session_of(source)
        key = f"telegram:{self.bot}:update:{update_id}"
        delay = 1.0
        async with self._lock(session_id):
            while True:
                try:
                    await self._answer(source, session_id, text, key, create=True)
                    return
                except TurnError as exc:
                    if exc.kind not in ("too_many_turns", "in_progress", "session_busy"):
                        raise
                    logger.info("Telegram update %s waits: %s", update_id, exc.message)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _MAX_UPDATE_RETRY_SECONDS)
                except TelegramError as exc:
                    if exc.gone:
                        logger.info("Telegram chat %s is gone: %s", source.chat_id, exc)
                        return
                    if not exc.transient:
                        logger.warning("Telegram refused the reply to %s: %s", update_id, exc)
                        return
                    # The turn is stored; a retry replays it and edits what was sent.
                    wait = exc.retry_after if exc.retry_after is not None else delay
                    logger.info(
                        "Telegram reply to %s: %s; retrying in %.0f s", update_id, exc, wait
                    )
                    await asyncio.sleep(wait)
                    delay = min(delay * 2, _MAX_UPDATE_RETRY_SECONDS)

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
        """An internal event (a wake-up from ``deliver_wake``): a turn answered in the chat."""
        source = event.source
        if source is None:
            raise ValueError("a Telegram event needs its SessionSource")
        session_id = event.session_id or telegram_session_id(source)
        ident = event.metadata.get("idempotency_key")
        key = f"telegram:{self.bot}:wake:{ident}" if ident else None
        lock = self._lock(session_id)
        try:
            # The chat's running turn first; holding the claim meanwhile is no attempt lost.
            async with asyncio.timeout(self.wake_wait_seconds):
                await lock.acquire()
        except TimeoutError:
            raise WakeDeliveryError(
                f"chat {source.chat_id} stayed busy for {self.wake_wait_seconds:g}s",
                transient=True,
            ) from None
        try:
            return await self._answer(
                source, session_id, event.text, key, create=False, wakeup=True
            )
        except TelegramError as exc:
            if exc.gone:
                # The chat is gone for the bot (blocked, kicked, deactivated): Telegram's
                # own words are the reason the delivery is dropped with.
                raise SessionGone(session_id, reason=f"Telegram: {exc.description}") from exc
            if exc.error_code == 429:
                # Honour the wait, then give the claim back without spending the attempt.
                await asyncio.sleep(min(exc.retry_after or 1.0, self.wake_wait_seconds))
            raise WakeDeliveryError(
                str(exc), transient=exc.transient, status=exc.error_code
            ) from exc
        except TurnError as exc:
            if exc.kind in ("session_not_found", "session_deleted"):
                raise SessionGone(session_id) from exc
            raise WakeDeliveryError(
                exc.message,
                transient=exc.kind in ("too_many_turns", "in_progress", "session_busy"),
            ) from exc
        finally:
            lock.release()

    # ----------------------------------------------------------------- one answer

    async def _answer(
        self,
        source: SessionSource,
        session_id: str,
        text: str,
        key: str | None,
        *,
        create: bool,
        wakeup: bool = False,
    ) -> str:
        """Run (or replay) the turn and send its reply; raises ``TelegramError``."""
        if key is not None and await asyncio.to_thread(self.state.reply_finished, key):
            return ""
        typing = asyncio.create_task(self._typing(source))
        self._sources[session_id] = source
        try:
            turn = await self.turns.start(
                TurnRequest(
                    session_id=session_id,
                    messages=[{"role": "user", "content": text}],
                    create=source if create else None,
                    idempotency_key=key,
                    stream=True,
                    bind_key_to_request=False,
                    wakeup=wakeup,
                )
            )
            reply = _Reply(self, source, key)
            await reply.load()
            if isinstance(turn, ReplayedTurn):
                final = str(turn.response.get("content") or "")
            else:
                assert turn.deltas is not None
                while True:
                    piece = await turn.deltas.get()
                    if piece is None:
                        break
                    if isinstance(piece, str):
                        await reply.grow(piece)
                final = str((await turn.task).get("content") or "")
        finally:
            self._sources.pop(session_id, None)
            typing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await typing
        await reply.finish(final)
        return final

    async def _typing(self, source: SessionSource) -> None:
        while True:
            with contextlib.suppress(TelegramError):
                await self.api.call(
                    "sendChatAction",
                    {"chat_id": source.chat_id, "action": "typing", **thread_params(source)},
                )
            await asyncio.sleep(_TYPING_EVERY_SECONDS)

    # ----------------------------------------------------------------- sending

    async def send_text(
        self, source: SessionSource, text: str, *, message_id: int | None = None
    ) -> int:
        """Send (or, with ``message_id``, edit to) one piece of markdown; its message id."""
        if message_id is None:
            result = await self._formatted(
                "sendMessage", {"chat_id": source.chat_id, **thread_params(source)}, text
            )
            return int(result["message_id"]) if isinstance(result, dict) else 0
        try:
            await self._formatted(
                "editMessageText", {"chat_id": source.chat_id, "message_id": message_id}, text
            )
        except TelegramError as exc:
            if not exc.not_modified:
                raise
        return message_id

    async def _formatted(self, method: str, params: dict[str, Any], text: str) -> Any:
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

    async def send(
        self, chat_id: str, text: str, *, metadata: dict[str, Any] | None = None
    ) -> SendResult:
        source = SessionSource(
            platform=Platform.TELEGRAM,
            chat_id=chat_id,
            thread_id=(metadata or {}).get("thread_id"),
        )
        last: int | None = None
        try:
            for piece in split_message(text):
                last = await self.send_text(source, piece)
        except TelegramError as exc:
            return SendResult(success=False, error=str(exc), retryable=exc.transient)
        return SendResult(success=True, message_id=str(last) if last is not None else None)


class _Reply:
    """One reply: streamed into its first message, then split and finished durably."""

    def __init__(self, adapter: TelegramAdapter, source: SessionSource, key: str | None) -> None:
        self.adapter = adapter
        self.source = source
        self.key = key
        self.parts: dict[int, int] = {}
        self.text = ""
        self.shown = ""
        self.last_edit = 0.0
        self.streaming = True
        self.stopped_by: TelegramError | None = None

    async def load(self) -> None:
        if self.key is not None:
            self.parts = await asyncio.to_thread(self.adapter.state.reply_parts, self.key)

    async def _put(self, index: int, piece: str) -> None:
        message_id = self.parts.get(index)
        new_id = await self.adapter.send_text(self.source, piece, message_id=message_id)
        if message_id is None:
            self.parts[index] = new_id
            if self.key is not None:
                await asyncio.to_thread(
                    self.adapter.state.record_part, self.key, index, self.source.chat_id, new_id
                )

    async def grow(self, piece: str) -> None:
        """More streamed text: edit the first message, throttled; failures only pause it."""
        self.text += piece
        if not self.streaming or not self.text.strip():
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self.parts and now - self.last_edit < self.adapter.edit_interval:
            return
        head = split_message(self.text)[0]
        if head == self.shown:
            return
        try:
            await self._put(0, head)
        except TelegramError as exc:
            # The final send reports what is wrong. A 429 or a chat that is gone is
            # reported as such at once: the caller waits retry_after and tries later, or
            # drops, instead of sending into it again.
            self.streaming = False
            if exc.error_code == 429 or exc.gone:
                self.stopped_by = exc
            return
        self.shown = head
        self.last_edit = loop.time()

    async def finish(self, final: str) -> None:
        if self.stopped_by is not None:
            raise self.stopped_by
        pieces = split_message(final or "(no reply)")
        for index, piece in enumerate(pieces):
            if index == 0 and piece == self.shown:
                continue
            await self._put(index, piece)
        if self.key is not None:
            await asyncio.to_thread(self.adapter.state.finish_reply, self.key)
