"""Above the surface port: what every chat platform does the same way, written once.

``ChatTurns`` is built by each chat adapter over its ``ChatSurface`` (the adapter itself),
its ``TurnService`` and its ``ReplyRecords``; the adapter installs ``wake`` as its message
handler and hands each user message to ``answer_message``:

* ``answer_message``: a user's message, answered once. The turn runs under the key that names
  the platform's message, so a message taken again after a crash is answered from the stored
  turn instead of running the agent again, and the reply's pieces already sent are edited,
  not sent twice. Messages of one chat are answered in order (one lock per session). A busy
  session or a full server is waited out; a ``RATE_LIMITED`` platform is waited out for its
  ``Retry-After``, other transient failures with a growing delay; a chat that is ``GONE``
  (blocked bot, deleted chat) is logged with the platform's reason and the message dropped.
* ``wake``: the handler of internal events, i.e. the wake-up rules for every platform. The
  wake-up is a turn (``wakeup=True``: the turn service holds it behind a pending approval of
  the session) answered in the chat, keyed by the delivery id (combined results come as one
  event from ``gateway.delivery_targets.PushTarget``, keyed by all their ids). A chat whose
  turn is running is waited for while the claim is held (no attempt spent), up to
  ``wake_wait_seconds``; then, and for a rate limit (after waiting its ``Retry-After``) or a
  failing platform, ``WakeDeliveryError(transient=True)``: the runner releases the claim
  retryably, refunding the attempt. A chat that is gone, or a session deleted, is
  ``SessionGone``: the delivery is dropped with the platform's reason, the result kept.
* ``/timers`` typed as a message: answered by the bot itself with the chat's schedules and
  pending reminders (``gateway.surfaces.timers``), no turn; under the message's key like a
  reply, so a message taken again is not answered twice.
* the reply: streamed into its first message by editing it (when ``limits.can_edit``), at
  most once per ``limits.edit_interval``; the final text split by the surface and finished
  durably in the reply records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gateway.adapter import MessageEvent
from gateway.session import SessionGone, SessionSource
from gateway.surfaces.port import ChatSurface, Refusal, ReplyRecords, SurfaceError
from gateway.surfaces.timers import asks_for_timers, timers_answer
from gateway.turns.service import ReplayedTurn, TurnError, TurnRequest, TurnService
from gateway.wake import WakeDeliveryError

__all__ = ["BUSY_TURN_KINDS", "ChatTurns"]

logger = logging.getLogger(__name__)

# Turn refusals that are a wait (the session or the server is busy), never a failure.
BUSY_TURN_KINDS = frozenset({"too_many_turns", "in_progress", "session_busy"})
_TYPING_EVERY_SECONDS = 4.0
_MAX_RETRY_SECONDS = 60.0
_MAX_LOCKS = 1024


class ChatTurns:
    """See the module docstring."""

    def __init__(
        self,
        surface: ChatSurface,
        turns: TurnService,
        records: ReplyRecords,
        *,
        key_prefix: str,
        wake_wait_seconds: float = 240.0,
    ) -> None:
        self.surface = surface
        # Names this bot's turns among every surface's idempotency keys ("telegram:<bot>").
        self.key_prefix = key_prefix
        self.turns = turns
        self.records = records
        self.wake_wait_seconds = wake_wait_seconds
        self._locks: dict[str, asyncio.Lock] = {}
        # The chat each running turn's session answers in: where its approvals are asked.
        self.sources: dict[str, SessionSource] = {}

    async def source_of(self, session_id: str) -> SessionSource | None:
        """Where ``session_id``'s chat answers on this platform: the running turn's source,
        else the session's stored one (an approval asked after a restart, or by a server
        that did not run the turn); None for another platform's or a gone session."""
        source = self.sources.get(session_id)
        if source is not None:
            return source
        session = await asyncio.to_thread(self.turns.store.get_session, session_id)
        if session is None or not isinstance(session.source, dict):
            return None
        stored = SessionSource.from_dict(session.source)
        return stored if stored.platform is self.surface.platform else None

    def lock(self, session_id: str) -> asyncio.Lock:
        """The lock that keeps one chat's turns (messages and wake-ups) in order."""
        lock = self._locks.get(session_id)
        if lock is None:
            if len(self._locks) > _MAX_LOCKS:
                # Forget the locks of idle chats (nobody holds or waits for them).
                for idle in [k for k, v in self._locks.items() if not v.locked()]:
                    del self._locks[idle]
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    # ----------------------------------------------------------------- user messages

    async def answer_message(self, event: MessageEvent, *, key: str) -> None:
        """Answer a user's message once (see the module docstring): ``event`` carries the
        chat (``source``), the session it talks to (``session_id``) and the text; ``key``
        names the platform's message once. Never raises for a platform failure or a busy
        session, only for what no wait can fix (logged by the caller)."""
        source, session_id, text = event.source, event.session_id, event.text
        if source is None or not session_id:
            raise ValueError(f"a {self._name} message needs its SessionSource and session id")
        delay = 1.0
        async with self.lock(session_id):
            while True:
                try:
                    await self.answer(source, session_id, text, key, create=True)
                    return
                except TurnError as exc:
                    if exc.kind not in BUSY_TURN_KINDS:
                        raise
                    logger.info("%s message %s waits: %s", self._name, key, exc.message)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _MAX_RETRY_SECONDS)
                except SurfaceError as exc:
                    if exc.gone:
                        logger.info(
                            "%s chat %s is gone: %s", self._name, source.chat_id, exc.reason
                        )
                        return
                    if not exc.transient:
                        logger.warning("%s refused the reply to %s: %s", self._name, key, exc)
                        return
                    # The turn is stored; a retry replays it and edits what was sent.
                    wait = exc.retry_after if exc.retry_after is not None else delay
                    logger.info(
                        "%s reply to %s: %s; retrying in %.0f s", self._name, key, exc, wait
                    )
                    await asyncio.sleep(wait)
                    delay = min(delay * 2, _MAX_RETRY_SECONDS)

    # ----------------------------------------------------------------- wake-ups

    async def wake(self, event: MessageEvent) -> str | None:
        """An internal event (a wake-up from ``deliver_wake``): a turn answered in the chat,
        under the wake-up rules (see the module docstring)."""
        source = event.source
        if source is None:
            raise ValueError(f"a {self._name} wake-up needs its SessionSource")
        if not event.session_id:
            raise ValueError(f"a {self._name} wake-up needs its session id")
        session_id = event.session_id
        ident = event.metadata.get("idempotency_key")
        key = f"{self.key_prefix}:wake:{ident}" if ident else None
        lock = self.lock(session_id)
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
            return await self.answer(source, session_id, event.text, key, create=False, wakeup=True)
        except SurfaceError as exc:
            if exc.gone:
                # The platform's own words are the reason the delivery is dropped with.
                raise SessionGone(session_id, reason=f"{self._name}: {exc.reason}") from exc
            if exc.kind is Refusal.RATE_LIMITED:
                # Honour the wait, then give the claim back without spending the attempt.
                await asyncio.sleep(min(exc.retry_after or 1.0, self.wake_wait_seconds))
            raise WakeDeliveryError(str(exc), transient=exc.transient, status=exc.code) from exc
        except TurnError as exc:
            if exc.kind in ("session_not_found", "session_deleted"):
                raise SessionGone(session_id) from exc
            raise WakeDeliveryError(exc.message, transient=exc.kind in BUSY_TURN_KINDS) from exc
        finally:
            lock.release()

    # ----------------------------------------------------------------- one answer

    async def answer(
        self,
        source: SessionSource,
        session_id: str,
        text: str,
        key: str | None,
        *,
        create: bool,
        wakeup: bool = False,
    ) -> str:
        """Run (or replay) the turn and send its reply; raises ``SurfaceError``."""
        if key is not None and await asyncio.to_thread(self.records.reply_finished, key):
            return ""
        if create and asks_for_timers(text):
            # A user's command, answered by the bot itself: nothing for the agent to do.
            reply = _Reply(self, source, key)
            await reply.load()
            final = await timers_answer(session_id)
            await reply.finish(final)
            return final
        typing = asyncio.create_task(self._typing(source))
        self.sources[session_id] = source
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
            self.sources.pop(session_id, None)
            typing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await typing
        await reply.finish(final)
        return final

    async def _typing(self, source: SessionSource) -> None:
        while True:
            await self.surface.typing(source)
            await asyncio.sleep(_TYPING_EVERY_SECONDS)

    @property
    def _name(self) -> str:
        return self.surface.platform.value.capitalize()


class _Reply:
    """One reply: streamed into its first message, then split and finished durably."""

    def __init__(self, chat: ChatTurns, source: SessionSource, key: str | None) -> None:
        self.chat = chat
        self.surface = chat.surface
        self.source = source
        self.key = key
        self.parts: dict[int, int] = {}
        self.text = ""
        self.shown = ""
        self.last_edit = 0.0
        self.streaming = chat.surface.limits.can_edit
        self.stopped_by: SurfaceError | None = None

    async def load(self) -> None:
        if self.key is not None:
            self.parts = await asyncio.to_thread(self.chat.records.reply_parts, self.key)

    async def _put(self, index: int, piece: str) -> None:
        message_id = self.parts.get(index)
        new_id = await self.surface.send_text(self.source, piece, edit=message_id)
        if message_id is None:
            self.parts[index] = new_id
            if self.key is not None:
                await asyncio.to_thread(
                    self.chat.records.record_part, self.key, index, self.source.chat_id, new_id
                )

    async def grow(self, piece: str) -> None:
        """More streamed text: edit the first message, throttled; failures only pause it."""
        self.text += piece
        if not self.streaming or not self.text.strip():
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self.parts and now - self.last_edit < self.surface.limits.edit_interval:
            return
        head = self.surface.split(self.text)[0]
        if head == self.shown:
            return
        try:
            await self._put(0, head)
        except SurfaceError as exc:
            # The final send reports what is wrong. A rate limit or a chat that is gone is
            # reported as such at once: the caller waits retry_after and tries later, or
            # drops, instead of sending into it again.
            self.streaming = False
            if exc.kind is Refusal.RATE_LIMITED or exc.gone:
                self.stopped_by = exc
            return
        self.shown = head
        self.last_edit = loop.time()

    async def finish(self, final: str) -> None:
        if self.stopped_by is not None:
            raise self.stopped_by
        pieces = self.surface.split(final or "(no reply)")
        for index, piece in enumerate(pieces):
            if index == 0 and piece == self.shown:
                continue
            await self._put(index, piece)
        if self.key is not None:
            await asyncio.to_thread(self.chat.records.finish_reply, self.key)
