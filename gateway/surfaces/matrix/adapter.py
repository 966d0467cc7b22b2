"""The Matrix adapter: a chat surface (``gateway.surfaces.port.ChatSurface``) over the
client-server API (mautrix's ``HTTPAPI``, ``client``).

Started by ``reveille serve`` when ``MATRIX_HOMESERVER`` is set.

* Login: ``MATRIX_ACCESS_TOKEN``, or ``MATRIX_PASSWORD`` once: the device it makes (access
  token and device id) is kept in the store and used again by every later start, so a
  restart is no new device. A token the homeserver refuses stops the start
  (``MatrixLoginRefused``).
* Receiving: one long-poll ``/sync`` loop, run by the one server holding the bot's lease in
  the store (renewed every ``LEASE_TICK_SECONDS``; a dead holder's is taken over). Each
  batch's messages are answered in tasks, and
  its ``next_batch`` token is stored (``platform_value``) only once every message of it and
  of every batch before it has been answered. A SIGKILL anywhere therefore syncs again from
  a token before the unanswered messages, and takes them again; the turn key
  (``matrix:message:<event id>``) makes a message taken twice answered once. The first sync
  of a bot (no token stored) answers no history: only what was written after the adapter
  started.
* Rooms: invites are accepted from ``allowed_users`` only (rejected otherwise); none allowed
  is nobody. A room of two members is a direct chat, a larger one a group where every
  message of an allowed user is answered. An encrypted room is told once that encrypted
  rooms are not supported yet, and nothing in it is answered (the bot cannot read it).
* Replies (``format``): ``org.matrix.custom.html`` made safe by construction, the markdown as
  the plain ``body`` beside it, split at ``MAX_MESSAGE_LENGTH`` characters, sent once as
  finished (``can_edit`` is off: on Matrix every edit is an event of its own that clients
  show as "(edited)"). A reply re-run after a crash replaces a piece already sent
  (``m.replace``) instead of sending it again. The port's message ids are integers, Matrix's
  event ids strings: each sent event gets a 60-bit number, and the number's event id is kept
  in the store so that a restart can still replace it.
* Approvals are reactions: the question says to react ✅ (approve once) or ❌ (deny), and
  the bot puts both reactions under it to click. Only the conversation's owner decides
  (``decide_press``); the answer is a notice in reply to the question, and a decided
  question is replaced by its verdict.
* Wake-ups: ``handle_message`` with an internal event goes to ``ChatTurns.wake``.
* Errors (``client.surface_error``): ``M_LIMIT_EXCEEDED`` carries the homeserver's
  ``retry_after_ms`` (``RATE_LIMITED``, honoured above the port, and by the sync loop);
  ``M_FORBIDDEN`` and unknown rooms are ``GONE``; 5xx and connection failures ``TRANSIENT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
import time
from collections import deque
from typing import Any, Protocol

from mautrix.api import Method

from delivery.telegram_backend import TelegramBackend
from gateway.adapter import BasePlatformAdapter, MessageEvent
from gateway.approvals import ApprovalRecord, Approvals
from gateway.config import Platform
from gateway.session import SessionSource
from gateway.surfaces.approval_press import decide_press
from gateway.surfaces.approval_text import question_markdown
from gateway.surfaces.chat import ChatTurns
from gateway.surfaces.matrix.client import MatrixClient
from gateway.surfaces.matrix.format import MAX_MESSAGE_LENGTH, split_message, to_html
from gateway.surfaces.matrix.intake import (
    Invite,
    Reaction,
    RoomMessage,
    SyncBatch,
    matrix_session_id,
    parse_sync,
    room_source,
)
from gateway.surfaces.port import (
    ApprovalPress,
    Refusal,
    ReplyRecords,
    SplitSend,
    SurfaceError,
    SurfaceLimits,
)
from gateway.turns.service import TurnService

__all__ = ["ENCRYPTED_NOTICE", "MatrixAdapter", "MatrixLoginRefused", "MatrixRecords"]

logger = logging.getLogger(__name__)

ENCRYPTED_NOTICE = (
    "Encrypted rooms are not supported yet: I cannot read this room. "
    "Talk to me in a room without encryption."
)
SYNC_TIMEOUT_MS = 30_000
# How often the /sync lease is renewed (it lapses after the state's lease seconds, 6 s).
LEASE_TICK_SECONDS = 2.0
# How long a sent message's event id (and a question's approval) is kept for a re-run.
KEEP_SECONDS = 7 * 24 * 3600.0
_FILTER = json.dumps(
    {
        "presence": {"not_types": ["*"]},
        "account_data": {"not_types": ["*"]},
        # Lazy-loaded members: the room's summary then carries its member count.
        "room": {
            "timeline": {"limit": 50, "lazy_load_members": True},
            "state": {"lazy_load_members": True},
            "ephemeral": {"not_types": ["*"]},
        },
    }
)
APPROVE_KEY, DENY_KEY = "✅", "❌"


class MatrixRecords(ReplyRecords, Protocol):
    """The reply records of the port, and the chat-to-session map (the store's chat
    platform state, as every chat surface reads it)."""

    def chat_session(self, chat_key: str) -> str | None: ...

    def hold_poll_lease(self, bot: str) -> bool: ...

    def release_poll_lease(self, bot: str) -> None: ...


class MatrixLoginRefused(RuntimeError):
    """The homeserver refused the access token or the password at start."""


def _key(reaction: str) -> str:
    return reaction.replace("\ufe0f", "").strip()


class MatrixAdapter(SplitSend, BasePlatformAdapter):
    """See the module docstring."""

    platform = Platform.MATRIX
    supports_async_delivery = True

    def __init__(
        self,
        *,
        homeserver: str,
        user_id: str,
        turns: TurnService,
        state: TelegramBackend,
        records: MatrixRecords,
        access_token: str = "",
        password: str = "",
        allowed_users: frozenset[str] = frozenset(),
        approvals: Approvals | None = None,
        wake_wait_seconds: float = 240.0,
        sync_timeout_ms: int = SYNC_TIMEOUT_MS,
    ) -> None:
        super().__init__()
        self.homeserver = homeserver.rstrip("/")
        self.user_id = user_id
        self.access_token = access_token
        self.password = password
        self.turns = turns
        self.state = state
        self.records = records
        self.allowed_users = frozenset(str(u).strip() for u in allowed_users if str(u).strip())
        self.approvals = approvals
        self.sync_timeout_ms = sync_timeout_ms
        self.limits = SurfaceLimits(MAX_MESSAGE_LENGTH, can_edit=False)
        self.chat = ChatTurns(
            self, turns, self.records, key_prefix="matrix", wake_wait_seconds=wake_wait_seconds
        )
        self.client = MatrixClient(self.homeserver, access_token)
        self.ignored_messages = 0
        self._members: dict[str, int] = {}
        self._told_encrypted: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        # Batches whose messages are not all answered yet, oldest first: (token, tasks).
        self._batches: deque[tuple[str, set[asyncio.Task[Any]]]] = deque()
        self._since: str | None = None
        self._started = time.time()
        self._stored_since: str | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self._stopping = False
        if approvals is not None:
            turns.on_approval = self.ask_approval
        self.set_message_handler(self.chat.wake)

    def _name(self, what: str) -> str:
        """The store key of this bot's value ``what``."""
        return f"matrix:{self.user_id}:{what}"

    async def _value(self, what: str) -> str | None:
        return await asyncio.to_thread(self.state.platform_value, self._name(what))

    async def _set_value(self, what: str, value: str, *, passing: bool = False) -> None:
        """``passing``: forgotten by ``prune`` after ``KEEP_SECONDS`` (a sent message's
        event id, an approval question's), not kept for good (the token, the device)."""
        written_at = time.time() if passing else None
        await asyncio.to_thread(
            self.state.set_platform_value, self._name(what), value, written_at=written_at
        )

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        # What a week-old reply or question needs no more (shared with the other chats).
        await asyncio.to_thread(self.state.prune, time.time() - KEEP_SECONDS)
        await self._login()
        self._started = time.time()
        if not self.allowed_users:
            logger.warning("Matrix: MATRIX_ALLOWED_USERS is empty: the bot answers nobody")
        self._lease_task = asyncio.create_task(self._lease_loop(), name="matrix-lease")

    async def _lease_loop(self) -> None:
        """Run the ``/sync`` loop while this server holds the bot's lease in the store: of
        several servers sharing it, one syncs; when it dies, another takes over from the
        token it stored."""
        lease = f"matrix:{self.user_id}"
        while not self._stopping:
            try:
                held = await asyncio.to_thread(self.records.hold_poll_lease, lease)
            except Exception:
                logger.exception("Matrix: could not reach the shared state")
                held = False
            running = self._loop_task is not None and not self._loop_task.done()
            if held and not running:
                self._since = self._stored_since = await self._value("sync")
                self._loop_task = asyncio.create_task(self._sync_loop(), name="matrix-sync")
            elif not held and running and self._loop_task is not None:
                logger.warning("Matrix: another server holds the /sync lease; not syncing")
                self._loop_task.cancel()
            await asyncio.sleep(LEASE_TICK_SECONDS)

    async def _login(self) -> None:
        if not self.access_token:
            saved = await self._value("device")
            if saved:
                self.client.use_token(str(json.loads(saved).get("access_token") or ""))
                if await self._whoami_ok():
                    return
            if not self.password:
                raise MatrixLoginRefused("Matrix: set MATRIX_ACCESS_TOKEN or MATRIX_PASSWORD")
            body = {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": self.user_id},
                "password": self.password,
                "initial_device_display_name": "Reveille",
            }
            try:
                answer = await self.client.call(Method.POST, self.client.v3.login, body)
            except SurfaceError as exc:
                raise MatrixLoginRefused(f"Matrix refused the password login: {exc}") from exc
            token, device = str(answer.get("access_token")), str(answer.get("device_id"))
            await self._set_value(
                "device", json.dumps({"access_token": token, "device_id": device})
            )
            self.client.use_token(token)
        if not await self._whoami_ok():
            raise MatrixLoginRefused("Matrix refused the access token (whoami)")

    async def _whoami_ok(self) -> bool:
        try:
            who = await self.client.call(Method.GET, self.client.v3.account.whoami)
        except SurfaceError as exc:
            if exc.kind is Refusal.REFUSED or exc.gone:
                return False
            raise
        found = str(who.get("user_id") or "")
        if found and found != self.user_id:
            logger.warning(
                "Matrix: the token is %s's, not %s's; using %s", found, self.user_id, found
            )
            self.user_id = found
        return True

    async def stop(self, *, grace_seconds: float = 10.0) -> None:
        """Take no more messages, give the answers in flight ``grace_seconds``, store the
        token of what was answered, and disconnect."""
        self._stopping = True
        for task in (self._lease_task, self._loop_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace_seconds)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._advance()
            await asyncio.to_thread(self.records.release_poll_lease, f"matrix:{self.user_id}")
        await self.client.close()

    # ----------------------------------------------------------------- intake

    async def _sync_loop(self) -> None:
        delay = 1.0
        while not self._stopping:
            query = {"filter": _FILTER, "timeout": str(self.sync_timeout_ms)}
            if self._since:
                query["since"] = self._since
            try:
                data = await self.client.call(
                    Method.GET,
                    self.client.v3.sync,
                    query=query,
                    timeout=self.sync_timeout_ms / 1000 + 30,
                )
            except SurfaceError as exc:
                wait = exc.retry_after if exc.kind is Refusal.RATE_LIMITED else delay
                delay = min(delay * 2, 60.0)
                logger.warning("Matrix: /sync failed (%s); again in %.1f s", exc, wait or delay)
                await asyncio.sleep(wait or delay)
                continue
            delay = 1.0
            batch = parse_sync(data, self.user_id)
            logger.debug(
                "Matrix: /sync: %d message(s), %d invite(s), %d reaction(s)",
                len(batch.messages),
                len(batch.invites),
                len(batch.reactions),
            )
            if not batch.next_batch:
                continue
            await self._take(batch, first=self._since is None)
            self._since = batch.next_batch
            await self._advance()

    async def _take(self, batch: SyncBatch, *, first: bool) -> None:
        self._members.update(batch.members)
        tasks: set[asyncio.Task[Any]] = set()
        for room_id in batch.encrypted - self._told_encrypted:
            self._told_encrypted.add(room_id)
            tasks.add(self._spawn(self._tell_encrypted(room_id), f"matrix-encrypted-{room_id}"))
        for invite in batch.invites:
            tasks.add(self._spawn(self._invited(invite), f"matrix-invite-{invite.room_id}"))
        for message in batch.messages:
            # A bot's first sync is the rooms' history: only what came after the start.
            if message.room_id in self._told_encrypted or (first and message.at < self._started):
                continue
            task = self._take_message(message)
            if task is not None:
                tasks.add(task)
        if not first:
            for reaction in batch.reactions:
                tasks.add(self._spawn(self._on_reaction(reaction), "matrix-reaction"))
        self._batches.append((batch.next_batch, tasks))

    async def _advance(self) -> None:
        """Store the token after the last batch whose messages (and every earlier batch's)
        are all answered."""
        token: str | None = None
        while self._batches and all(t.done() for t in self._batches[0][1]):
            token = self._batches.popleft()[0]
        if token is not None and token != self._stored_since:
            await self._set_value("sync", token)
            self._stored_since = token

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _allowed(self, user_id: str) -> bool:
        return user_id in self.allowed_users

    async def _invited(self, invite: Invite) -> None:
        path = self.client.v3.rooms[invite.room_id]
        try:
            if self._allowed(invite.sender):
                await self.client.call(Method.POST, path.join, {})
                logger.info("Matrix: joined %s (invited by %s)", invite.room_id, invite.sender)
                if invite.encrypted and invite.room_id not in self._told_encrypted:
                    self._told_encrypted.add(invite.room_id)
                    await self._tell_encrypted(invite.room_id)
            else:
                await self.client.call(Method.POST, path.leave, {})
                logger.info(
                    "Matrix: rejected the invite to %s from %s (not in MATRIX_ALLOWED_USERS)",
                    invite.room_id,
                    invite.sender,
                )
        except SurfaceError as exc:
            logger.warning("Matrix: could not answer the invite to %s: %s", invite.room_id, exc)

    async def _tell_encrypted(self, room_id: str) -> None:
        try:
            await self._send(room_id, self._content(ENCRYPTED_NOTICE, notice=True))
        except SurfaceError as exc:
            logger.warning("Matrix: could not tell %s it is encrypted: %s", room_id, exc)

    def _take_message(self, message: RoomMessage) -> asyncio.Task[Any] | None:
        if not self._allowed(message.sender):
            self.ignored_messages += 1
            logger.info(
                "Matrix: ignoring a message from %s (not in MATRIX_ALLOWED_USERS)", message.sender
            )
            return None
        return self._spawn(self._answer(message), f"matrix-message-{message.event_id}")

    async def _member_count(self, room_id: str) -> int | None:
        """How many joined the room: from the syncs, else asked once."""
        if room_id not in self._members:
            path = self.client.v3.rooms[room_id].joined_members
            try:
                joined = (await self.client.call(Method.GET, path)).get("joined")
            except SurfaceError as exc:
                logger.warning("Matrix: could not count the members of %s: %s", room_id, exc)
                return None
            if isinstance(joined, dict):
                self._members[room_id] = len(joined)
        return self._members.get(room_id)

    async def _answer(self, message: RoomMessage) -> None:
        members = await self._member_count(message.room_id)
        source = room_source(message.room_id, message.sender, members)
        base = matrix_session_id(source)
        session_id = await asyncio.to_thread(self.records.chat_session, base) or base
        try:
            event = MessageEvent(
                text=message.text,
                source=source,
                session_id=session_id,
                message_id=message.event_id,
            )
            await self.chat.answer_message(event, key=f"matrix:message:{message.event_id}")
        except Exception:
            logger.exception("Matrix message %s could not be answered; dropped", message.event_id)

    # ----------------------------------------------------------------- approvals

    async def ask_approval(self, approval: ApprovalRecord) -> None:
        source = await self.chat.source_of(approval.session_id)
        if source is None:
            logger.warning("approval %s has no Matrix room to ask in", approval.id)
            return
        text = _question(approval)
        try:
            event_id = await self._send(source.chat_id, self._content(text))
            if approval.status == "expired":
                return
            await self._set_value(f"approval:{event_id}", approval.id, passing=True)
            for key in (APPROVE_KEY, DENY_KEY):
                relates = {"rel_type": "m.annotation", "event_id": event_id, "key": key}
                await self._send(source.chat_id, {"m.relates_to": relates}, kind="m.reaction")
        except SurfaceError as exc:
            # Still decidable (``reveille approvals``); the turn waits for it either way.
            logger.warning("could not ask approval %s in %s: %s", approval.id, source.chat_id, exc)

    def owner_of(self, source: SessionSource) -> str | None:
        """The user who started the conversation (a direct chat's user, a group's first
        writer)."""
        return source.user_id

    async def _on_reaction(self, reaction: Reaction) -> None:
        key = _key(reaction.key)
        if key not in (APPROVE_KEY, DENY_KEY):
            return
        approval_id = await self._value(f"approval:{reaction.target}")
        if approval_id is None:
            return
        press = ApprovalPress(approval_id, key == APPROVE_KEY, reaction.sender, reaction.room_id)
        answer = await decide_press(
            self, self.turns.store, self.approvals, press, allowed_users=self.allowed_users
        )
        try:
            if answer.verdict is not None:
                await self._replace(reaction.room_id, reaction.target, answer.verdict)
            notice = self._content(answer.answer, notice=True)
            notice["m.relates_to"] = {"m.in_reply_to": {"event_id": reaction.target}}
            await self._send(reaction.room_id, notice)
        except SurfaceError as exc:
            logger.warning("Matrix: could not answer the press in %s: %s", reaction.room_id, exc)

    # ----------------------------------------------------------------- sending (the port)

    def split(self, text: str) -> list[str]:
        return split_message(text, self.limits.max_message_chars)

    @staticmethod
    def _content(text: str, *, notice: bool = False) -> dict[str, object]:
        body = text or "(no reply)"
        return {
            "msgtype": "m.notice" if notice else "m.text",
            "body": body,
            "format": "org.matrix.custom.html",
            "formatted_body": to_html(body),
        }

    async def _send(
        self, room_id: str, content: dict[str, object], *, kind: str = "m.room.message"
    ) -> str:
        txn = secrets.token_hex(12)
        path = self.client.v3.rooms[room_id].send[kind][txn]
        answer = await self.client.call(Method.PUT, path, content)
        return str(answer.get("event_id") or "")

    async def _replace(self, room_id: str, event_id: str, text: str) -> str:
        new = self._content(text)
        content = {
            **new,
            "body": f"* {new['body']}",
            "m.new_content": new,
            "m.relates_to": {"rel_type": "m.replace", "event_id": event_id},
        }
        return await self._send(room_id, content)

    async def send_text(self, to: SessionSource, text: str, *, edit: int | None = None) -> int:
        if edit is not None:
            original = await self._value(f"event:{edit}")
            if original:
                await self._replace(to.chat_id, original, text)
                return edit
        event_id = await self._send(to.chat_id, self._content(text))
        number = int(hashlib.sha256(event_id.encode()).hexdigest()[:15], 16)
        await self._set_value(f"event:{number}", event_id, passing=True)
        return number

    async def typing(self, to: SessionSource) -> None:
        path = self.client.v3.rooms[to.chat_id].typing[self.user_id]
        with contextlib.suppress(SurfaceError):
            await self.client.call(Method.PUT, path, {"typing": True, "timeout": 5000})


def _question(approval: ApprovalRecord) -> str:
    """The question's markdown, and how to answer it while it is open."""
    text = question_markdown(approval)
    if approval.status == "expired":
        return text
    return f"{text}\nReact {APPROVE_KEY} to approve once, {DENY_KEY} to deny."
