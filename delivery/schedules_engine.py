"""Recurring schedules on the ledger: one occurrence at a time, each a ledger row.

A schedule's next occurrence is a ledger row due at its instant (``Ledger.schedule``) whose
id is ``occurrence_id(schedule, instant)``: unique, so a replay, a second server or a
restored backup never fires an occurrence twice. Nothing polls per schedule: the row's due
time wakes the re-offer scheduler like any timer, and the scheduler's pass calls
``advance_due`` first, which handles every schedule whose occurrence has come:

1. the occurrence's row exists (it is written now if a crash came between the schedule's
   write and its row's);
2. the misfire policy is applied to it once (``delivery.schedules.decide``) and the decision
   recorded in its event, in one ledger operation under the row's lock: whoever comes second
   (another server, a retry after a crash) reads the decision instead of making another;
3. the next occurrence's row is written (idempotently: same id);
4. the schedule moves on (a compare-and-set on its ``next_at``).

Then the pass offers the row, whose event now says whether it runs or was ``missed`` (a
visible event: ``status == "missed"``) and how many occurrences were missed with it.

Pausing or cancelling a schedule changes its state first and then cancels its occurrence
rows that are not due yet; ``advance_due`` reads the state again after writing a next row and
cancels that row if the schedule stopped meanwhile, so whichever of the two comes second
finds the row.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final

from delivery.backend import LedgerTx
from delivery.errors import DuplicateDeliveryError
from delivery.events import SCHEDULED_WAKEUP
from delivery.ids import new_id
from delivery.ledger import Ledger
from delivery.rows import RowQuery
from delivery.schedules import (
    ACTIVE,
    CANCELLED,
    PAUSED,
    SCHEDULE_KIND,
    Firing,
    Misfire,
    Origin,
    Schedule,
    ScheduleError,
    Target,
    decide,
    next_instant,
    occurrence_id,
)
from delivery.schedules_backend import ScheduleBackend

__all__ = ["MISSED_STATUS", "ScheduleEngine", "ScheduleNotFound"]

log = logging.getLogger(__name__)

MISSED_STATUS: Final = "missed"
"""The ``status`` of an occurrence's event that did not run (``skip``, or late past
``fire_if_within``): shown in the conversation, never silent."""

_DECISION = "advanced_to"  # the event key that records the decision (and the next instant)
_BATCH = 500


class ScheduleNotFound(LookupError):
    """No such schedule (or not one of this conversation's)."""


@dataclass(frozen=True, slots=True)
class _Decision:
    runs: bool
    missed: int
    next_at: float


class ScheduleEngine:
    """Schedules of one store, fired through one ledger (see the module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        store: ScheduleBackend,
        *,
        clock: Callable[[], float] | None = None,
        open_conversation: Callable[[Origin, str], Origin] | None = None,
    ) -> None:
        """``open_conversation(asking, title)``: a new conversation on the surface of
        ``asking``, for a schedule whose target is ``own`` (ScheduleError where the surface
        has none); None: no such target here."""
        self.ledger = ledger
        self.store = store
        self.clock = clock or ledger.clock
        self.open_conversation = open_conversation

    # -- making and steering ----------------------------------------------------------------

    def create(
        self,
        *,
        note: str,
        cron: str | None = None,
        zone: str = "UTC",
        every_seconds: float | None = None,
        misfire: Misfire | None = None,
        target: Target = "this",
        session_key: str | None = None,
        origin_session_id: str | None = None,
        origin_ui_session_id: str | None = None,
    ) -> Schedule:
        """A new active schedule and its first occurrence's row (the spec is checked by the
        caller: ``tools.schedule_tool``)."""
        if (cron is None) == (every_seconds is None):
            raise ValueError("a schedule has a cron expression or an interval, not both")
        if target == "own":
            # Its occurrences come home to a conversation of its own, which the user can
            # continue like any other; it is made before the schedule, so none is lost.
            if self.open_conversation is None:
                raise ScheduleError("a conversation of its own is not available here")
            own = self.open_conversation(
                Origin(session_key, origin_session_id, origin_ui_session_id), note
            )
            session_key, origin_session_id = own.session_key, own.origin_session_id
            origin_ui_session_id = own.origin_ui_session_id
        now = self.clock()
        draft = Schedule(
            id=new_id("sch_"),
            note=note,
            cron=cron,
            zone=zone if cron is not None else "UTC",
            every_seconds=every_seconds,
            anchor=float(math.floor(now)),
            misfire=misfire or Misfire(),
            target=target,
            state=ACTIVE,
            session_key=session_key,
            origin_session_id=origin_session_id,
            origin_ui_session_id=origin_ui_session_id,
            created_at=now,
            updated_at=now,
            next_at=None,
        )
        schedule = replace(draft, next_at=next_instant(draft, now))
        self.store.add(schedule)
        assert schedule.next_at is not None
        self._write_occurrence(schedule, schedule.next_at)
        return schedule

    def get(self, schedule_id: str, *, session: str | None = None) -> Schedule:
        """The schedule; with ``session``, only when it is that conversation's."""
        found = self.store.get(schedule_id) if isinstance(schedule_id, str) else None
        if found is None or (
            session is not None
            and session
            not in (found.session_key, found.origin_session_id, found.origin_ui_session_id)
        ):
            raise ScheduleNotFound(f"no schedule {str(schedule_id)[:80]!r}")
        return found

    def pause(self, schedule_id: str, *, session: str | None = None, by: str = "user") -> Schedule:
        found = self.get(schedule_id, session=session)
        now = self.clock()
        if found.state == ACTIVE and self.store.set_state(found.id, [ACTIVE], PAUSED, None, now):
            self._cancel_waiting(found, by)
        return self.get(found.id)

    def resume(self, schedule_id: str, *, session: str | None = None) -> Schedule:
        found = self.get(schedule_id, session=session)
        now = self.clock()
        next_at = next_instant(found, now)
        # An occurrence whose row the pause settled cannot fire again (its id is taken):
        # resume from the first one after it.
        while (row := self.ledger.get(occurrence_id(found.id, next_at))) is not None and (
            row.delivery_state != "pending"
        ):
            next_at = next_instant(found, next_at)
        if found.state == PAUSED and self.store.set_state(found.id, [PAUSED], ACTIVE, next_at, now):
            self._write_occurrence(found, next_at)
            self._stop_if_stopped(found.id, next_at)
        return self.get(found.id)

    def cancel(self, schedule_id: str, *, session: str | None = None, by: str = "user") -> Schedule:
        found = self.get(schedule_id, session=session)
        now = self.clock()
        if found.state != CANCELLED:
            self.store.set_state(found.id, [ACTIVE, PAUSED], CANCELLED, None, now)
        # Also when it was cancelled already: a row a racing pass wrote is cancelled too.
        self._cancel_waiting(found, by)
        return self.get(found.id)

    def find(
        self, *, session: str | None = None, include_cancelled: bool = False, limit: int = 100
    ) -> list[Schedule]:
        states = None if include_cancelled else [ACTIVE, PAUSED]
        return self.store.find(session=session, states=states, limit=limit)

    # -- firing -------------------------------------------------------------------------------

    def advance_due(self, now: float | None = None) -> int:
        """Handle every schedule whose occurrence has come (the re-offer scheduler calls this
        at each pass, before it offers due rows); how many moved on here."""
        now = self.clock() if now is None else now
        moved = 0
        for schedule in self.store.due(now, _BATCH):
            try:
                moved += self._advance(schedule, now)
            except Exception:  # one broken schedule must not stop the others
                log.exception("schedule %s: could not fire its occurrence", schedule.id)
        return moved

    def _advance(self, schedule: Schedule, now: float) -> int:
        instant = schedule.next_at
        assert instant is not None
        row_id = self._write_occurrence(schedule, instant)
        decision = self._decide_once(row_id, schedule, instant, now)
        if decision is None:
            return 0  # another server holds the row right now: it decides
        self._write_occurrence(schedule, decision.next_at)
        if not self.store.advance(
            schedule.id,
            instant,
            decision.next_at,
            fired=1 if decision.runs else 0,
            missed=decision.missed + (0 if decision.runs else 1),
            now=now,
        ):
            self._stop_if_stopped(schedule.id, decision.next_at)
            return 0
        self._stop_if_stopped(schedule.id, decision.next_at)
        return 1

    def _decide_once(
        self, row_id: str, schedule: Schedule, instant: float, now: float
    ) -> _Decision | None:
        firing = decide(schedule, instant, now)

        def op(tx: LedgerTx) -> _Decision | None:
            if row_id not in tx.lock_free([row_id]):
                return None
            row = tx.get(row_id)
            if row is None:
                return None
            event = dict(row["event"] or {})
            if _DECISION in event:
                return _Decision(
                    event.get("status") != MISSED_STATUS,
                    int(event.get("missed") or 0),
                    float(event[_DECISION]),
                )
            event.update(_decided(firing))
            # The replay cap counts from the decision: an occurrence fired (or shown missed)
            # after an outage of days is news now, not a stale replay to drop.
            changes = {"event": event, "replay_from": max(now, row["replay_from"] or now)}
            if not tx.update(row_id, {"updated_at": row["updated_at"]}, changes):
                return None
            tx.audit(row_id, "schedule", _describe(firing), now)
            return _Decision(firing.runs, firing.missed, firing.next_at)

        result: _Decision | None = self.ledger.backend.write(op)
        return result

    # -- rows -----------------------------------------------------------------------------------

    def _write_occurrence(self, schedule: Schedule, instant: float) -> str:
        """The row of the occurrence at ``instant``, written once (its id is its identity)."""
        row_id = occurrence_id(schedule.id, instant)
        if self.ledger.get(row_id) is not None:
            return row_id
        event: dict[str, object] = {
            "type": SCHEDULED_WAKEUP,
            "delivery_id": row_id,
            "status": "completed",
            "note": schedule.note,
            "due_at": instant,
            "zone": schedule.zone,
            "schedule_id": schedule.id,
            "schedule": schedule.describe_spec(),
            "session_key": schedule.session_key,
            "origin_session_id": schedule.origin_session_id,
            "origin_ui_session_id": schedule.origin_ui_session_id,
            "dispatched_at": schedule.created_at,
            "completed_at": instant,
        }
        # Another server may write it first: the same occurrence.
        with contextlib.suppress(DuplicateDeliveryError):
            self.ledger.schedule(
                row_id,
                kind=SCHEDULE_KIND,
                event=event,
                not_before=instant,
                session_key=schedule.session_key,
                origin_session_id=schedule.origin_session_id,
                origin_ui_session_id=schedule.origin_ui_session_id,
                goal=schedule.note,
            )
        return row_id

    def _stop_if_stopped(self, schedule_id: str, next_at: float) -> None:
        """After writing the row at ``next_at``: if the schedule was paused or cancelled
        meanwhile, that row must not fire (its stopper may have looked before it existed)."""
        current = self.store.get(schedule_id)
        if current is not None and current.state != ACTIVE:
            self.ledger.cancel(occurrence_id(schedule_id, next_at), by=f"schedule {current.state}")

    def _cancel_waiting(self, schedule: Schedule, by: str) -> None:
        """Cancel the schedule's occurrence rows that are not due yet (those due already
        fire: they were due before the schedule stopped)."""
        query = RowQuery(
            kind=SCHEDULE_KIND, delivery_state="pending", session=schedule.session, limit=1000
        )
        for row in self.ledger.query(query):
            if row.event is not None and row.event.get("schedule_id") == schedule.id:
                self.ledger.cancel(row.id, by=by, deliver_here=False)


def _decided(firing: Firing) -> dict[str, object]:
    changes: dict[str, object] = {
        _DECISION: firing.next_at,
        "missed": firing.missed,
        "late_seconds": round(firing.late_seconds, 3),
    }
    if not firing.runs:
        changes["status"] = MISSED_STATUS
    return changes


def _describe(firing: Firing) -> str:
    what = "fires" if firing.runs else "missed"
    return f"{what} (late {firing.late_seconds:.0f} s, {firing.missed} more missed)"
