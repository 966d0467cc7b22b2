"""Telegram's face of approvals: the inline keyboard a command is asked with, and its presses.

``ask`` sends the keyboard (Approve once / Deny) into the chat whose turn (or background
task, after its turn ended: the chat its session was created for) waits; each
button's ``callback_data`` is ``appr:<approval id>:y|n``, an opaque id and never the
command. ``on_press`` turns a callback query into an ``ApprovalPress`` and decides it by the
rule every platform shares (``gateway.surfaces.approval_press``: only the owner of the
approval's chat, once); the presser gets the answer as the query's toast, and a decided
keyboard's message is edited to say what was decided, which takes its buttons away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from agent.messages import JSONObject
from gateway.approvals import ApprovalRecord, Approvals
from gateway.config import Platform
from gateway.session import SessionSource, SessionStore
from gateway.surfaces.approval_press import decide_press
from gateway.surfaces.port import ApprovalPress, ChatSurface, PressAnswer
from gateway.surfaces.telegram.api import TelegramApi, TelegramError, thread_params
from gateway.surfaces.telegram.format import escape, to_html

__all__ = ["APPROVAL_PREFIX", "ApprovalKeyboard"]

logger = logging.getLogger(__name__)

APPROVAL_PREFIX = "appr:"


class ApprovalKeyboard:
    """See the module docstring. ``sources`` is the adapter's map of the chats its
    running turns answer in, by session id."""

    def __init__(
        self,
        surface: ChatSurface,
        api: TelegramApi,
        store: SessionStore,
        approvals: Approvals | None,
        allowed_users: frozenset[str],
        sources: dict[str, SessionSource],
    ) -> None:
        self.surface = surface
        self.api = api
        self.store = store
        self.approvals = approvals
        self.allowed_users = allowed_users
        self._sources = sources

    async def ask(self, approval: ApprovalRecord) -> None:
        """A turn of this chat, or background work it started, waits for ``approval``: ask
        with a keyboard."""
        source = self._sources.get(approval.session_id) or await self._stored_source(approval)
        if source is None:
            logger.warning("approval %s has no chat to ask in", approval.id)
            return
        if approval.status == "expired":
            await self._say_expired(source, approval)
            return
        if approval.background:
            text = (
                "<b>Approval needed.</b> A background task "
                f"(<code>{escape(approval.unit_id)}</code>) wants to run:\n"
                f"<pre>{escape(approval.command)}</pre>"
            )
        else:
            text = (
                "<b>Approval needed.</b> The agent wants to run:\n"
                f"<pre>{escape(approval.command)}</pre>"
            )
        keyboard = {
            "inline_keyboard": [
                [
                    {"text": "Approve once", "callback_data": f"{APPROVAL_PREFIX}{approval.id}:y"},
                    {"text": "Deny", "callback_data": f"{APPROVAL_PREFIX}{approval.id}:n"},
                ]
            ]
        }
        try:
            await self.api.call(
                "sendMessage",
                {
                    "chat_id": source.chat_id,
                    "text": text,
                    "parse_mode": "HTML",
                    "reply_markup": keyboard,
                    **thread_params(source),
                },
            )
        except TelegramError as exc:
            # Still decidable (``reveille approvals``); the turn waits for it either way.
            logger.warning(
                "could not ask approval %s in chat %s: %s", approval.id, source.chat_id, exc
            )

    async def _say_expired(self, source: SessionSource, approval: ApprovalRecord) -> None:
        """The chat's one notice that a background task's approval expired."""
        text = (
            f"<b>Approval expired.</b> Nobody answered, so the background task "
            f"<code>{escape(approval.unit_id)}</code> did not run:\n"
            f"<pre>{escape(approval.command)}</pre>"
        )
        try:
            await self.api.call(
                "sendMessage",
                {
                    "chat_id": source.chat_id,
                    "text": text,
                    "parse_mode": "HTML",
                    **thread_params(source),
                },
            )
        except TelegramError as exc:
            logger.warning("could not say approval %s expired: %s", approval.id, exc)

    async def _stored_source(self, approval: ApprovalRecord) -> SessionSource | None:
        """The chat of a session no turn runs in now (a background unit asks after its
        turn ended): the one its session was created for."""
        session = await asyncio.to_thread(self.store.get_session, approval.session_id)
        if session is None or not isinstance(session.source, dict):
            return None
        source = SessionSource.from_dict(session.source)
        return source if source.platform is Platform.TELEGRAM else None

    async def on_press(self, query: JSONObject) -> None:
        """A button press (callback query): decide the approval it names, once."""
        query_id = str(query.get("id") or "")
        data = query.get("data")
        raw_user = query.get("from")
        user = str(raw_user.get("id")) if isinstance(raw_user, dict) else ""
        raw_message = query.get("message")
        message = raw_message if isinstance(raw_message, dict) else None
        chat = message.get("chat") if message is not None else None
        here = str(chat.get("id")) if isinstance(chat, dict) else ""
        result = PressAnswer("This button does nothing.")
        if isinstance(data, str) and data.startswith(APPROVAL_PREFIX) and data[-2:] in (":y", ":n"):
            press = ApprovalPress(
                approval_id=data[len(APPROVAL_PREFIX) : -2],
                approve=data.endswith(":y"),
                user_id=user,
                chat_id=here,
            )
            result = await decide_press(
                self.surface, self.store, self.approvals, press, allowed_users=self.allowed_users
            )
        answer, verdict = result.answer, result.verdict
        with contextlib.suppress(TelegramError):
            await self.api.call(
                "answerCallbackQuery", {"callback_query_id": query_id, "text": answer}
            )
        if verdict is not None and message is not None:
            chat = message.get("chat")
            with contextlib.suppress(TelegramError):
                await self.api.call(
                    "editMessageText",
                    {
                        "chat_id": chat.get("id") if isinstance(chat, dict) else None,
                        "message_id": message.get("message_id"),
                        "text": to_html(verdict),
                        "parse_mode": "HTML",
                    },
                )
