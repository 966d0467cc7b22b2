"""Turns in web UI sessions: what ``api.routes`` binds as its ``SessionTurns``.

``astart`` (on the event loop: the web UI's handlers and its wake-up delivery target call it
directly) starts a turn of the web UI's ``TurnService`` (``platform=Platform.WEBUI``) in the
background and answers a typed ``TurnAccepted`` or ``TurnRefused``; ``start_turn`` is the
same for a caller on another thread (the seed-pinned ``api.routes``), in the dict shape. The
turn's content deltas and tool steps become ``turn.*`` events of the durable event log while
``ActiveStream`` keeps the reply so far for a tab that reloads mid-turn. ``stop`` cancels
the turn through its fence (``StartedTurn.cancel``): the text shown so far is stored, marked
stopped; a Stop that comes once the turn's reply is being stored loses (``stopped: false``,
the turn ends done), so a turn is never stored both whole and stopped. A user's message is
stored before it is accepted (202), marked failed with "the server stopped before
answering" and ``pending`` (its stream): what the turn stores next (its message and reply,
its stopped reply, or the message marked failed with the real error) stands in its place,
and while the turn runs the transcript hides it (``api.views``); a server killed mid-turn
leaves it as it was, so that after a restart (``close_orphans`` ends the dead turn) the
message shows failed with a Retry. A wake-up turn
(``source="process_wakeup"``) first announces its card (``wakeup``), a ``toast`` and the
session's unread mark; it is keyed by its delivery id so a re-offer of a wake-up that
already ran never runs it twice. When a session becomes free (its turn ended), ``on_free``
is awaited: deferred wake-ups fire right then.

Refusals (``api.turn_answers.TurnRefused``): 400 no message, 404 unknown session, 409 for a
session that is not a web UI one, an active stream (``active_stream_id``),
``agent_runtime_stale`` or ``process_wakeup_paused``, 503 ``retryable`` when storage is
unavailable or too many turns run.

The running turn's record, an edit or regenerate of the last turn, and what is kept of a
stopped or failed one are ``api.turn_stream``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agent.messages import JSONObject
from agent.tools import ToolProgress
from api import config as cfg
from api.approvals import ApprovalRecord, Approvals
from api.attachments import ImageAttachment
from api.event_log import EventLog, LoggedEvent
from api.routes import refusal
from api.turn_answers import TurnAccepted, TurnAnswer, TurnRefused
from api.turn_stream import (
    ActiveStream,
    Revision,
    pin_tool_steps,
    revise_last_turn,
    store_failed,
    store_stopped,
    tool_step,
)
from api.views import (
    card_of_wake_text,
    session_source,
    session_view,
    title_from_text,
)
from gateway.config import Platform
from gateway.session import SessionGone, SessionStore, SessionStoreError
from gateway.tasks import finish_or_cancel
from gateway.turns.hold import end_lease, renew_lease
from gateway.turns.service import ReplayedTurn, StartedTurn, TurnError, TurnRequest, TurnService

__all__ = ["ActiveStream", "Revision", "WebTurns"]

logger = logging.getLogger(__name__)

WAKEUP_SOURCE = "process_wakeup"
# What a user's message says when its server died before answering (stored with it before
# the 202, see the module docstring).
STOPPED_BEFORE_ANSWERING = "the server stopped before answering"
_START_TIMEOUT_SECONDS = 30.0
_STOP_WAIT_SECONDS = 5.0  # how long a Stop waits for another server's turn to end


class WebTurns:
    """Starts, follows and stops web UI turns (see the module docstring)."""

    def __init__(
        self,
        store: SessionStore,
        service: TurnService,
        log: EventLog,
        approvals: Approvals,
        *,
        runtime_stale: Callable[[], bool] = lambda: False,
    ) -> None:
        self.store = store
        self.service = service
        self.log = log
        self.approvals = approvals
        self.runtime_stale = runtime_stale
        self.on_free: Callable[[str], Awaitable[None]] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._active: dict[str, ActiveStream] = {}
        self._paused: set[str] = set()
        self._closing = False
        self._starting: set[asyncio.Task[Any]] = set()
        self._followers: set[asyncio.Task[None]] = set()
        approvals.listen(self._approval_changed)
        log.watch(self._stop_requested)
        log.watch(self._approval_decided)

    # ----------------------------------------------------------------- api.routes.SessionTurns

    def start_turn(self, session_id: str, text: str, *, source: str) -> JSONObject:
        """``astart`` for a caller on another thread (the seed-pinned ``api.routes`` entry),
        answered in its dict shape; the web UI's own callers await ``astart``."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return refusal(503, "the web UI is not running", retryable=True)
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is loop:
                return refusal(503, "start_turn was called on the event loop", retryable=True)
        future = asyncio.run_coroutine_threadsafe(self.astart(session_id, text, source), loop)
        try:
            return future.result(timeout=_START_TIMEOUT_SECONDS).as_dict()
        except Exception as exc:
            future.cancel()
            logger.warning("starting a turn in %s failed: %r", session_id, exc)
            return refusal(503, "the web UI did not answer in time", retryable=True)

    def is_busy(self, session_id: str) -> bool:
        """Whether a turn runs in the session on any server (a store read: call it from a
        thread; the event loop awaits ``ais_busy``)."""
        return session_id in self.store.running_turns()

    async def ais_busy(self, session_id: str) -> bool:
        return await asyncio.to_thread(self.is_busy, session_id)

    # ----------------------------------------------------------------- reads

    def active(self, session_id: str) -> ActiveStream | None:
        with self._lock:
            return self._active.get(session_id)

    async def session_dict(self, session_id: str) -> JSONObject | None:
        record = await asyncio.to_thread(self.store.get_session, session_id)
        if record is None:
            return None
        unread = session_id in await self.log.unread_ids()
        return session_view(record, unread=unread, busy=await self.ais_busy(session_id))

    async def mark_read(self, session_id: str) -> None:
        """The session was opened: its unread mark and its unseen completions clear."""
        with cfg.MAPS_LOCK:
            cfg.PENDING_BG_TASK_COMPLETIONS.pop(session_id, None)
        await self.log.set_unread(session_id, False)
        await self.announce_session(session_id)

    async def announce_session(self, session_id: str) -> None:
        try:
            view = await self.session_dict(session_id)
        except Exception:
            logger.exception("could not read session %s to announce it", session_id)
            return
        if view is not None:
            try:
                await self.log.append("session", {"session": view})
            except Exception:
                logger.warning("could not announce session %s (shutting down?)", session_id)

    async def _approval_changed(self, approval: ApprovalRecord) -> None:
        """An approval was asked or decided: its card and its session's busy mark change."""
        await self.log.append(
            "approval", {"session_id": approval.session_id, "approval": approval.as_dict()}
        )
        await self.announce_session(approval.session_id)

    async def _title_session(self, session_id: str, title: str) -> None:
        """An untitled session is named after its first message (a title set meanwhile,
        by the user or another server, stays)."""
        try:
            await self.store.aset_title(session_id, title, if_untitled=True)
        except (SessionStoreError, ValueError) as exc:
            logger.warning("could not title session %s: %s", session_id, exc)

    async def close_orphans(self) -> int:
        """End the streams of turns whose server died mid-turn (a tab open through the crash
        still shows them running) and free their sessions. Their work is not lost: a wake-up
        is offered again; a user's message, stored before its 202, shows failed ("the server
        stopped before answering") with a Retry once its turn no longer runs."""
        ended = 0
        for lease in await asyncio.to_thread(self.store.orphaned_turns):
            if not await asyncio.to_thread(self.store.end_turn, lease.session_id, lease.stream_id):
                continue  # another server ended it first
            ended += 1
            await self.log.append(
                "turn.end",
                {
                    "session_id": lease.session_id,
                    "stream_id": lease.stream_id,
                    "status": "error",
                    "error": "interrupted: the server running this turn stopped",
                    "content": "",
                },
            )
            await self.announce_session(lease.session_id)
        return ended

    # ----------------------------------------------------------------- starting

    async def astart(
        self,
        session_id: str,
        text: str,
        source: str,
        *,
        images: Sequence[ImageAttachment] = (),
        revise: Revision | None = None,
    ) -> TurnAnswer:
        """Start a turn in a web UI session, on the event loop; a refusal is typed.
        ``images`` (checked by ``api.attachments``) go to the model as image parts of the
        user's message and are stored with it. ``revise``: the turn replaces the last one,
        whose messages stay in the transcript marked superseded (409 ``not_last_message``
        when the message named is not the last one, or a wake-up came after it)."""
        if self._closing:
            return TurnRefused(503, "the web UI is shutting down", retryable=True)
        task = asyncio.current_task()
        if task is not None:
            self._starting.add(task)
        try:
            return await self._astart(session_id, text, source, tuple(images), revise)
        finally:
            if task is not None:
                self._starting.discard(task)

    async def _astart(
        self,
        session_id: str,
        text: str,
        source: str,
        images: tuple[ImageAttachment, ...] = (),
        revise: Revision | None = None,
    ) -> TurnAnswer:
        again = revise is not None and revise.how == "regenerated"
        if not isinstance(text, str) or not (text.strip() or images or again):
            return TurnRefused(400, "message is required", "message_required")
        try:
            record = await asyncio.to_thread(self.store.get_session, session_id)
        except SessionStoreError as exc:
            return TurnRefused(503, f"the session store is unavailable: {exc}", retryable=True)
        if record is None:
            return TurnRefused(404, "Session not found", "session_not_found")
        if session_source(record) != Platform.WEBUI.value:
            return TurnRefused(409, "only web UI sessions can be chatted in", "not_a_webui_session")
        # A stat of every agent source file: off the event loop.
        if await asyncio.to_thread(self.runtime_stale):
            return TurnRefused(409, "agent_runtime_stale", "agent_runtime_stale", retryable=True)
        wakeup = source == WAKEUP_SOURCE
        card = card_of_wake_text(text) if wakeup else None
        stream = ActiveStream(
            stream_id=f"st_{secrets.token_hex(8)}",
            turn_id=f"turn_{secrets.token_hex(8)}",
            session_id=session_id,
            user_text=text,
            wakeup=wakeup,
            user_metadata={"images": [image.shown() for image in images]} if images else {},
        )
        with self._lock:
            if wakeup and session_id in self._paused:
                return TurnRefused(409, "process_wakeup_paused", "process_wakeup_paused")
            if not wakeup:
                self._paused.discard(session_id)  # the user is back: wake-ups may run again
        # The session is held in the store, not in this process: a turn, a wake-up or a
        # pending approval on any server sharing it keeps every other turn out.
        try:
            lease = await asyncio.to_thread(
                self.store.take_turn, session_id, stream.stream_id, wakeup=wakeup
            )
        except SessionStoreError as exc:
            return TurnRefused(503, f"the session store is unavailable: {exc}", retryable=True)
        if lease.stream_id != stream.stream_id:
            return TurnRefused(
                409,
                "this session already has an active stream",
                "active_stream",
                active_stream_id=lease.stream_id,
            )
        if revise is not None:
            try:
                revised = await revise_last_turn(self.store, session_id, revise, text, images)
            except (SessionStoreError, SessionGone) as exc:
                revised = TurnRefused(
                    503, f"the session store is unavailable: {exc}", retryable=True
                )
            if isinstance(revised, TurnRefused):
                await asyncio.to_thread(self.store.end_turn, session_id, stream.stream_id)
                return revised
            text, images = revised
            stream.user_text = text
            stream.user_metadata = {
                **({"images": [image.shown() for image in images]} if images else {}),
                **({"edited": True} if revise.how == "edited" else {}),
            }
        with self._lock:
            self._active[session_id] = stream
        stream.holder = asyncio.create_task(self._hold(stream))
        if not wakeup:
            refused = await self._keep_message(stream)
            if refused is not None:
                await asyncio.shield(self._free(stream))
                return refused
        try:
            answer = await self.service.start(
                TurnRequest(
                    session_id=session_id,
                    # The chat's own system prompt, stored with it, leads every turn of it.
                    messages=[
                        *(
                            [{"role": "system", "content": record.system_prompt}]
                            if record.system_prompt
                            else []
                        ),
                        {
                            "role": "user",
                            "content": (
                                [{"type": "text", "text": text}, *(i.part() for i in images)]
                                if images
                                else text
                            ),
                        },
                    ],
                    user_metadata=stream.user_metadata or None,
                    stream=True,
                    idempotency_key=(
                        f"webui-wake:{card.delivery_id}" if card and card.delivery_id else None
                    ),
                    bind_key_to_request=False,
                    wakeup=wakeup,
                    lease_stream_id=stream.stream_id,  # a compaction runs under this lease
                )
            )
        except BaseException as exc:
            if not wakeup and isinstance(exc, TurnError | SessionStoreError):
                # Refused after the message was kept: it stays, with why (and a Retry).
                await store_failed(self.store, stream, str(exc))
            await asyncio.shield(self._free(stream))
            if isinstance(exc, TurnError) and exc.kind in ("session_not_found", "session_deleted"):
                return TurnRefused(404, "Session not found", "session_not_found")
            if isinstance(exc, TurnError | SessionStoreError):
                return TurnRefused(503, str(exc), retryable=True)
            raise
        if isinstance(answer, ReplayedTurn):
            await self._free(stream)
            # This wake-up ran and was stored before (another offer, another process).
            return TurnAccepted(stream.stream_id, session_id, stream.turn_id)
        stream.started = answer
        stream.stored = asyncio.get_running_loop().create_future()
        accepted = TurnAccepted(stream.stream_id, session_id, stream.turn_id, stream.stored)
        try:
            if card is not None:
                cfg.add_card(session_id, card.as_dict())
                await self.log.append("wakeup", {"session_id": session_id, "card": card.as_dict()})
                await self.log.set_unread(session_id, True)
                await self.log.append(
                    "toast",
                    {
                        "session_id": session_id,
                        "title": record.title or "New chat",
                        "goal": card.goal,
                        "status": card.status,
                    },
                )
            elif not wakeup and not record.title and (first := title_from_text(text or "Image")):
                await self._title_session(session_id, first)
            event = await self.log.append(
                "turn.start",
                {
                    "session_id": session_id,
                    "stream_id": stream.stream_id,
                    "turn_id": stream.turn_id,
                    "wakeup": wakeup,
                    "user_text": None if wakeup else text,
                    "images": len(stream.user_metadata.get("images") or ()),
                },
            )
            stream.last_event_id = event.id
            await self.announce_session(session_id)
        except Exception:
            # The turn runs and is followed all the same: its events and its end still
            # reach the log once it is writable again, and the session is freed at the end.
            logger.exception("could not announce turn %s of %s", stream.turn_id, session_id)
        stream.follower = asyncio.create_task(self._follow(stream, answer))
        self._followers.add(stream.follower)
        stream.follower.add_done_callback(self._followers.discard)
        return accepted

    async def _keep_message(self, stream: ActiveStream) -> TurnRefused | None:
        """Store the user's message before the turn is accepted, as it would read if this
        server died now (see the module docstring); a refusal when it cannot be stored."""
        meta = {
            **stream.user_metadata,  # its images' thumbnails, an edit's mark
            "failed": True,
            "error": STOPPED_BEFORE_ANSWERING,
            "pending": stream.stream_id,
        }
        message = {"role": "user", "content": stream.user_text, "display_metadata": meta}
        try:
            await self.store.aappend_turn(stream.session_id, [message])
        except SessionGone:
            return TurnRefused(404, "Session not found", "session_not_found")
        except SessionStoreError as exc:
            return TurnRefused(503, f"the session store is unavailable: {exc}", retryable=True)
        return None

    async def _hold(self, stream: ActiveStream) -> None:
        """Renew the turn's lease while it runs. A turn that lost its session (this server
        stalled past the lease and another took the session over) is stopped, so that two
        turns never run in one session."""
        await renew_lease(self.store, stream.session_id, stream.stream_id)
        logger.warning("stopping turn %s of the lost session", stream.turn_id)
        if stream.started is not None:
            stream.started.cancel()  # unless its store began: then it is stored

    async def _free(self, stream: ActiveStream) -> None:
        """The turn ended: the session is free here and in the store. A lease that cannot be
        ended now (the store is failing) lapses by itself within ``TURN_LEASE_SECONDS``."""
        if stream.holder is not None:
            stream.holder.cancel()
        with self._lock:
            if self._active.get(stream.session_id) is stream:
                del self._active[stream.session_id]
        await end_lease(self.store, stream.session_id, stream.stream_id)

    # ----------------------------------------------------------------- following

    async def _follow(self, stream: ActiveStream, started: StartedTurn) -> None:
        base = {"session_id": stream.session_id, "stream_id": stream.stream_id}
        end: JSONObject = {**base, "status": "done"}
        stored = False  # set only once the turn is in the transcript
        try:
            assert started.deltas is not None
            queue = started.deltas
            carry: list[str | ToolProgress | None] = []
            while (piece := carry.pop() if carry else await queue.get()) is not None:
                if isinstance(piece, str):
                    # Pieces that arrived while the last event was written go out as one
                    # event: the log stays small and a fast model is not slowed down.
                    while not queue.empty():
                        more = queue.get_nowait()
                        if not isinstance(more, str):
                            carry.append(more)
                            break
                        piece += more
                    stream.text += piece
                    await self._tell(stream, "turn.delta", {**base, "text": piece})
                else:
                    step = tool_step(piece)
                    if step["status"] != "started":
                        with contextlib.suppress(Exception):
                            await self.log.add_tool_step(stream.session_id, stream.turn_id, **step)
                            stream.tool_steps += 1
                    await self._tell(stream, "turn.tool", {**base, **step})
            try:
                response = await asyncio.shield(started.task)
                stored = True  # the turn service answers only once it stored the turn
                end["content"] = str(response.get("content") or stream.text)
            except asyncio.CancelledError:
                if not started.task.cancelled():
                    raise
                end.update(status="stopped", content=stream.text)
                stored = await store_stopped(self.store, stream)
            except TurnError as exc:
                end.update(status="error", error=exc.message, content=stream.text)
                if stream.wakeup and exc.kind == "upstream":
                    with self._lock:
                        self._paused.add(stream.session_id)
                elif not stream.wakeup and exc.kind != "session_deleted":
                    await store_failed(self.store, stream, exc.message)
            except Exception as exc:
                logger.exception("turn %s failed", stream.turn_id)
                end.update(status="error", error=type(exc).__name__, content=stream.text)
                if not stream.wakeup:
                    await store_failed(self.store, stream, type(exc).__name__)
        finally:
            if stream.stored is not None and not stream.stored.done():
                stream.stored.set_result(stored)
            if stream.tool_steps:
                # Still the session's active turn: no other turn's reply is stored yet.
                await pin_tool_steps(self.store, self.log, stream, stored=stored)
            await self._free(stream)
            with contextlib.suppress(Exception):
                await self.log.append("turn.end", end)
            await self.announce_session(stream.session_id)
            if self.on_free is not None:
                try:
                    await self.on_free(stream.session_id)
                except Exception:
                    logger.exception("deferred wake-ups of %s failed", stream.session_id)

    async def _tell(self, stream: ActiveStream, kind: str, data: JSONObject) -> None:
        """Log a running turn's event. One that cannot be written (the log is failing) is
        skipped: the turn goes on, and its stored reply is what the transcript shows."""
        try:
            stream.last_event_id = (await self.log.append(kind, data)).id
        except Exception as exc:
            logger.warning("could not log %s of turn %s: %s", kind, stream.turn_id, exc)

    # ----------------------------------------------------------------- stopping

    async def stop(self, session_id: str) -> bool:
        """Cancel the session's running turn, on whichever server runs it; False when none
        runs. Another server's turn is asked to stop through the shared event log
        (``turn.stop``, which tabs ignore) and awaited until its session is free."""
        stream = self.active(session_id)
        if stream is None:
            return await self._stop_elsewhere(session_id)
        if stream.started is None or stream.started.task.done():
            return False
        if not stream.started.cancel():
            return False  # its reply is being stored: already completed
        if stream.follower is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(stream.follower)
        return True

    async def _stop_elsewhere(self, session_id: str) -> bool:
        """Ask the server running the turn (maybe this one, as its turn ends) to stop it, and
        answer how the turn ended: True when stopped, False when it completed first. A turn
        that has not ended within ``_STOP_WAIT_SECONDS`` was asked: True."""
        seen = await self.log.latest_id()  # first: a turn that ends meanwhile is seen
        lease = (await asyncio.to_thread(self.store.running_turns)).get(session_id)
        if lease is None:
            return False
        await self.log.append("turn.stop", {"session_id": session_id, "stream_id": lease.stream_id})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _STOP_WAIT_SECONDS
        while loop.time() < deadline:
            await asyncio.sleep(0.05)
            for event in await self.log.since(seen) or []:
                seen = max(seen, event.id)
                if event.type == "turn.end" and event.data.get("stream_id") == lease.stream_id:
                    return event.data.get("status") == "stopped"
        return True

    def _approval_decided(self, event: LoggedEvent) -> None:
        """An approval was decided, maybe through another server: a turn waiting for it here
        goes on at once."""
        approval = event.data.get("approval") if event.type == "approval" else None
        if isinstance(approval, dict) and approval.get("status") in ("approved", "denied"):
            self.approvals.settled(str(approval.get("id")), approval["status"] == "approved")

    def _stop_requested(self, event: LoggedEvent) -> None:
        """A tab asked another server to stop a turn that runs here."""
        if event.type != "turn.stop":
            return
        stream = self.active(str(event.data.get("session_id")))
        if stream is None or stream.stream_id != event.data.get("stream_id"):
            return
        if stream.started is not None and not stream.started.task.done():
            stream.started.cancel()

    async def drain(self, grace_seconds: float) -> None:
        """Refuse new turns (retryable), let running ones end, then stop the stragglers."""
        self._closing = True
        if self._starting:
            await asyncio.wait(set(self._starting), timeout=grace_seconds)
        await self.service.drain(grace_seconds)
        # Followers finish by writing the turn's end; one still busy when the log is
        # about to close is cancelled and awaited, so that nothing writes after it.
        await finish_or_cancel(self._followers, grace_seconds)
