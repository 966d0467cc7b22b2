"""Human confirmation of shell commands, kept in the store, for every surface.

``confirm_for(session_id)`` is the ``ToolContext.confirm`` hook of that session's turns: it
records a pending ``ApprovalRecord`` for the turn holding the session (its running-turn
lease), announces it (the listener, and the ask's own ``on_asked``), and waits for a
decision. ``decide(approval_id, approve)`` decides it once, in the store, from whichever
server or surface the person uses (the web UI, ``POST /api/approvals/{id}`` of the API
server, a Telegram button, ``reveille approvals``). The asking server learns it at once when
the decision was made in this process (``settled``), from the web UI's shared event log, or
by reading the record every ``poll_seconds`` otherwise. The session is busy while its turn
runs, so wake-ups and other turns wait for the decision on every server and never cross it.
A turn stopped while it waits, or one that lost its session, denies the command.

An approval whose turn is gone (its server died or restarted, its lease lapsed) can never be
answered: deciding it settles it as denied and raises ``Expired``, so a late button press
gets a clear answer and the record ends decided, never pending for ever.

Background work (a sub-agent; any detached unit) asks through ``confirm_unit_for``
(``ToolContext.confirm_unit``): its approval names the unit and holds NO session, so other
turns and wake-ups of the conversation go on while it waits. It is announced like a
turn's (the listener, ``on_asked``, and ``on_requested``: the webhook), waits the same way
(a local future, a read every ``poll_seconds``), and after ``timeout_seconds`` unanswered,
or once its unit's process is gone, it is settled ``expired`` (whoever reads it first):
the unit's hook raises ``ApprovalExpired`` ("nobody answered", never "denied"), and the
conversation gets one notice, a delivery row (``EXPIRED_DISPLAY_KIND``) its surface shows
and its next turn folds in. Asked, decided (how, by whom) and expired are logged.

A question that carries a form (an MCP server's ``elicitation/create``, marked by
``tools.mcp.elicitation.asking_form``) is recorded with its schema (``form``). A yes may
carry ``values`` (the API, the CLI): they are checked against the form before anything is
written (``FormError`` says why not) and kept as the approval's ``answer``; a yes without
values (a Telegram keyboard, a web UI card) answers with the form's defaults, and is
settled as denied when the form has a required field without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from agent.messages import JSONObject
from agent.tools import ApprovalExpired, ConfirmCallback, UnitConfirmCallback
from delivery.identity import current_identity, holder_is_dead
from delivery.session_backend import ApprovalRecord
from gateway.session import SessionGone, SessionStore
from tools.mcp.elicitation import FormError, FormQuestion, decided_answer, form_asked

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "EXPIRED_DISPLAY_KIND",
    "AlreadyDecided",
    "ApprovalListener",
    "ApprovalRecord",
    "Approvals",
    "Expired",
    "FormError",
    "decide_approval",
    "pending_approvals",
    "settle_if_stale",
]

# ``[shell] approval_timeout``: how long a background unit's approval waits for a person.
DEFAULT_TIMEOUT_SECONDS = 3600.0
# The one notice a conversation gets when a background unit's approval expired.
EXPIRED_DISPLAY_KIND = "approval_expired"

logger = logging.getLogger(__name__)


class AlreadyDecided(Exception):
    """The approval was decided before."""


class Expired(AlreadyDecided):
    """The approval's turn is gone (a restart, a lapsed lease): it was settled as denied; or
    a background unit's approval passed its deadline or lost its unit: settled expired."""

    def __init__(self, record: ApprovalRecord) -> None:
        super().__init__(record.id)
        self.record = record


# Told of every change: the approval (pending, then decided).
ApprovalListener = Callable[[ApprovalRecord], Awaitable[None]]


def pending_approvals(store: SessionStore) -> list[ApprovalRecord]:
    """Every approval a person may still answer, oldest first (store reads and writes: call
    it off the event loop): the one each running turn waits for (one per busy session at
    most), and every background unit's, those past their deadline or unit settled expired
    on the way (``settle_if_stale``)."""
    found = []
    for session_id in store.running_turns():
        record = store.pending_approval(session_id)
        if record is not None:
            found.append(record)
    for record in store.pending_unit_approvals():
        if settle_if_stale(store, record) is None:
            found.append(record)
    return sorted(found, key=lambda r: r.created_at)


def settle_if_stale(
    store: SessionStore, record: ApprovalRecord, now: float | None = None
) -> ApprovalRecord | None:
    """A pending background unit's approval nobody can answer any more (its deadline
    passed, its unit's process is gone) settled expired, once, with the conversation's
    notice; None while it is still answerable (or not a unit's). A store write."""
    if not record.background or record.status != "pending":
        return None
    now = time.time() if now is None else now
    if now < record.expires_at and not holder_is_dead(record.owner):
        return None
    settled, changed = store.expire_approval(record.id)
    if changed:
        why = "nobody answered in time" if now >= record.expires_at else "its unit is gone"
        logger.info(
            "approval %s of background unit %s expired (%s): %r was not run",
            record.id,
            record.unit_id,
            why,
            record.command,
        )
        _tell_expired(store, settled)
    return settled


def _tell_expired(store: SessionStore, record: ApprovalRecord) -> None:
    """The conversation's one notice (the dedupe key keeps it one on every server)."""
    text = (
        f"Approval {record.id} expired: nobody answered whether background task "
        f"{record.unit_id} may run {record.command!r}, so it was not run. The task was told "
        "that it expired (not that it was denied)."
    )
    try:
        store.append_message(
            record.session_id,
            "system",
            text,
            display_kind=EXPIRED_DISPLAY_KIND,
            display_metadata={
                "approval_id": record.id,
                "unit_id": record.unit_id,
                "command": record.command,
            },
            dedupe_key=f"approval-expired:{record.id}",
        )
    except SessionGone:
        logger.info(
            "session %s was deleted before approval %s expired", record.session_id, record.id
        )


def decide_approval(
    store: SessionStore,
    approval_id: str,
    approve: bool,
    *,
    by: str = "a person",
    values: JSONObject | None = None,
) -> ApprovalRecord:
    """Decide ``approval_id`` once (a store write: call it off the event loop); ``by``
    (the surface and who) is logged; ``values`` answer a form with a yes (see the module
    docstring).

    KeyError for an unknown id, AlreadyDecided for a decided one, Expired for one nobody
    may answer any more: a turn's that no longer holds its session (settled denied), a
    background unit's past its deadline or whose unit is gone (settled expired);
    FormError (nothing written) for values the form refuses, or values for a question
    without a form.
    """
    record = store.get_approval(approval_id)
    if record is None:
        raise KeyError(approval_id)
    if record.status != "pending":
        raise AlreadyDecided(approval_id)
    answer = ""
    if values is not None and not record.form:
        raise FormError(f"approval {approval_id} asks a yes or no, not values")
    if approve and record.form:
        content = decided_answer(record.form, values)
        if content is None:
            logger.info(
                "approval %s: a yes without values cannot fill its form (a required field "
                "has no default); declined",
                approval_id,
            )
            approve = False
        else:
            answer = json.dumps(content, ensure_ascii=False)
    if record.background:
        stale = settle_if_stale(store, record)
        if stale is not None:
            raise Expired(stale)
    else:
        lease = store.running_turns().get(record.session_id)
        if lease is None or lease.stream_id != record.stream_id:
            settled, _ = store.decide_approval(approval_id, False)
            raise Expired(settled)
    decided, changed = store.decide_approval(approval_id, approve, answer)
    if not changed:
        raise AlreadyDecided(approval_id)
    logger.info(
        "approval %s %s by %s: %r",
        approval_id,
        "approved" if approve else "denied",
        by,
        record.command,
    )
    return decided


class Approvals:
    """Asks and decides approvals in the store (see the module docstring)."""

    def __init__(
        self,
        store: SessionStore,
        *,
        poll_seconds: float = 2.0,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.store = store
        self._listener: ApprovalListener | None = None  # set by ``listen``
        self._poll_seconds = poll_seconds
        self.timeout_seconds = timeout_seconds
        # Told of each background unit's approval asked (the webhook): set by the root.
        self.on_requested: ApprovalListener | None = None
        # The decisions this process waits for, by approval id: a local decision wakes the
        # asking turn without waiting for the next read.
        self._waiting: dict[str, asyncio.Future[bool]] = {}

    def confirm_for(
        self, session_id: str, *, on_asked: ApprovalListener | None = None
    ) -> ConfirmCallback:
        """The hook of one turn; ``on_asked`` is told of each approval it records (the
        surface shows it: a message that the turn waits, a Telegram keyboard)."""

        async def confirm(command: str) -> bool:
            return await self._ask(session_id, command, on_asked)

        return confirm

    def confirm_unit_for(
        self, session_id: str, *, on_asked: ApprovalListener | None = None
    ) -> UnitConfirmCallback:
        """The ``ToolContext.confirm_unit`` hook of one conversation's turns: what their
        background units ask (see the module docstring); ``on_asked`` as ``confirm_for``'s,
        and told once more, with the record settled, when it expired."""

        async def confirm(unit_id: str, command: str) -> bool:
            return await self._ask_unit(session_id, unit_id, command, on_asked)

        return confirm

    def listen(self, on_change: ApprovalListener) -> None:
        """Be told of every change (the web UI's turns announce it to the open tabs)."""
        self._listener = on_change

    async def _on_change(self, approval: ApprovalRecord) -> None:
        if self._listener is not None:
            await self._listener(approval)

    async def _ask(
        self, session_id: str, command: str, on_asked: ApprovalListener | None = None
    ) -> bool:
        turns = await asyncio.to_thread(self.store.running_turns)
        lease = turns.get(session_id)
        if lease is None:
            logger.warning("a command in %s asked for approval outside a turn: denied", session_id)
            return False
        question = form_asked()
        approval = ApprovalRecord(
            id=f"appr_{secrets.token_hex(8)}",
            session_id=session_id,
            stream_id=lease.stream_id,
            command=command,
            status="pending",
            created_at=time.time(),
            form=question.schema if question is not None else "",
        )
        if not await asyncio.to_thread(self.store.ask_approval, approval):
            return False  # the turn no longer holds its session
        logger.info(
            "approval %s asked by turn %s in session %s: %r",
            approval.id,
            lease.stream_id,
            session_id,
            command,
        )
        decided = asyncio.get_running_loop().create_future()
        self._waiting[approval.id] = decided
        try:
            # Inside the try: a stop that lands while the approval is still being announced
            # must deny it too, or it would stay pending and keep the session busy.
            await self._on_change(approval)
            if on_asked is not None:
                await on_asked(approval)
            approved = await self._decision(approval.id, decided)
            if approved and question is not None:
                await self._answer(question, approval.id)
            return approved
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._deny_on_stop(approval.id))
            raise
        finally:
            self._waiting.pop(approval.id, None)

    async def _ask_unit(
        self, session_id: str, unit_id: str, command: str, on_asked: ApprovalListener | None
    ) -> bool:
        now = time.time()
        question = form_asked()
        approval = ApprovalRecord(
            id=f"appr_{secrets.token_hex(8)}",
            session_id=session_id,
            stream_id="",
            command=command,
            status="pending",
            created_at=now,
            unit_id=unit_id,
            owner=str(current_identity()),
            expires_at=now + self.timeout_seconds,
            form=question.schema if question is not None else "",
        )
        decided = asyncio.get_running_loop().create_future()
        self._waiting[approval.id] = decided
        # A task of its own: a unit stopped while its row is being written withdraws it only
        # once it is written.
        written = asyncio.ensure_future(asyncio.to_thread(self.store.ask_approval, approval))
        try:
            await asyncio.shield(written)
            logger.info(
                "approval %s asked by background unit %s in session %s: %r (expires in %.0f s)",
                approval.id,
                unit_id,
                session_id,
                command,
                self.timeout_seconds,
            )
            for tell in (self._on_change, on_asked, self.on_requested):
                if tell is not None:
                    try:
                        await tell(approval)
                    except Exception:  # one surface that cannot show it must not lose it
                        logger.exception("could not announce approval %s", approval.id)
            approved = await self._unit_decision(approval, decided, on_asked)
            if approved and question is not None:
                await self._answer(question, approval.id)
            return approved
        except asyncio.CancelledError:
            # The unit was stopped: nobody can answer for it any more.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._withdraw(approval.id, written))
            raise
        finally:
            self._waiting.pop(approval.id, None)

    async def _unit_decision(
        self,
        approval: ApprovalRecord,
        decided: asyncio.Future[bool],
        on_asked: ApprovalListener | None,
    ) -> bool:
        while True:
            left = approval.expires_at - time.time()
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(
                    asyncio.shield(decided), max(0.0, min(self._poll_seconds, left))
                )
            record = await asyncio.to_thread(self.store.get_approval, approval.id)
            if record is None:
                raise ApprovalExpired(approval.id)
            if record.status == "pending":
                record = await asyncio.to_thread(settle_if_stale, self.store, record) or record
            if record.status == "pending":
                continue
            if record.status != "approved":
                await self._on_change(record)  # decided or expired elsewhere
            if record.status == "expired":
                # The surface that asked says so where it asked (Telegram: a message); only
                # the waiting unit gets here, so it is said once.
                if on_asked is not None:
                    with contextlib.suppress(Exception):
                        await on_asked(record)
                raise ApprovalExpired(approval.id)
            return record.status == "approved"

    async def _answer(self, question: FormQuestion, approval_id: str) -> None:
        """The values the form was approved with (decided here or on another server)."""
        record = await asyncio.to_thread(self.store.get_approval, approval_id)
        if record is not None and record.answer:
            question.answer = json.loads(record.answer)

    async def _withdraw(self, approval_id: str, written: asyncio.Future[bool]) -> None:
        await written  # raises (nothing to withdraw) when the row could not be written
        record, changed = await asyncio.to_thread(self.store.expire_approval, approval_id)
        if changed:
            logger.info("approval %s withdrawn: its background unit stopped", approval_id)
            await self._on_change(record)

    async def _decision(self, approval_id: str, decided: asyncio.Future[bool]) -> bool:
        while True:
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(decided), self._poll_seconds)
            record = await asyncio.to_thread(self.store.get_approval, approval_id)
            if record is None:
                return False
            if record.status != "pending":
                if record.status == "approved":
                    return True
                await self._on_change(record)  # denied elsewhere, or its turn lost its lease
                return False

    async def _deny_on_stop(self, approval_id: str) -> None:
        record, changed = await asyncio.to_thread(self.store.decide_approval, approval_id, False)
        if changed:
            await self._on_change(record)

    async def decide(
        self,
        approval_id: str,
        approve: bool,
        *,
        by: str = "a person",
        values: JSONObject | None = None,
    ) -> ApprovalRecord:
        """KeyError for an unknown id, AlreadyDecided for a decided one, Expired (a kind of
        AlreadyDecided) for one nobody may answer any more, FormError for ``values`` its
        form refuses; ``by`` is logged."""
        try:
            record = await asyncio.to_thread(
                decide_approval, self.store, approval_id, approve, by=by, values=values
            )
        except Expired as exc:
            await self._on_change(exc.record)
            raise
        self.settled(approval_id, record.status == "approved")
        await self._on_change(record)
        return record

    def settled(self, approval_id: str, approve: bool) -> None:
        """An approval was decided (here, or through another server's event): the turn
        waiting for it in this process, if any, goes on."""
        waiting = self._waiting.get(approval_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(approve)

    async def pending_for(self, session_id: str) -> ApprovalRecord | None:
        """The approval the session's running turn waits for (what keeps it busy)."""
        return await asyncio.to_thread(self.store.pending_approval, session_id)

    async def unit_pending_for(self, session_id: str) -> list[ApprovalRecord]:
        """The background units' approvals of a session still answerable, oldest first."""

        def read() -> list[ApprovalRecord]:
            return [
                r
                for r in self.store.pending_unit_approvals()
                if r.session_id == session_id and settle_if_stale(self.store, r) is None
            ]

        return await asyncio.to_thread(read)

    async def pending(self) -> list[ApprovalRecord]:
        """Every pending approval in the store (see ``pending_approvals``)."""
        return await asyncio.to_thread(pending_approvals, self.store)
