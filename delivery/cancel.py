"""Stopping background work, and what it reports while it runs: the records and events of both.

A cancel is ONE compare-and-set on the row (``Ledger.cancel``): queued or running ->
``cancelled``, with a completion event that says who stopped it (the notice the
conversation gets). Whoever makes it, on whichever server, the row is settled at once; the
process that runs the work sees the row is no longer running (a poke through the store's
notifier, or its next progress write) and stops it. A result that arrives after that finds
the row terminal and is never delivered; a result recorded first makes the cancel answer
``already_finished``. So the race between the two is decided by the store, once.

``active_units`` is what every surface lists: the queued and running units with their
progress, and the wake-ups not due yet (state ``scheduled``, with ``due_at``).
Progress (``Progress``) is what a running unit last reported: its step (a model call, a
tool's name), its last output line and when. It is written to the row's ``progress``
column, throttled by its writer, so that every server sharing the store can show it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from delivery.backend import LedgerViews
from delivery.events import ASYNC_DELEGATION, PROCESS_COMPLETION, TIMER_KIND, WAIT_KIND
from delivery.json_types import JSONObject
from delivery.rows import LedgerRow, RowQuery
from delivery.states import ACTIVE_STATES, State

__all__ = [
    "ALREADY_FINISHED",
    "CANCELLED",
    "NOT_FOUND",
    "BackgroundUnit",
    "CancelOutcome",
    "Progress",
    "active_units",
    "cancelled_event",
    "is_active",
    "is_waiting",
]

CANCELLED = "cancelled"
SCHEDULED = "scheduled"  # how a wake-up not due yet is listed
ALREADY_FINISHED = "already_finished"
NOT_FOUND = "not_found"

_STEP_CHARS = 200
_LINE_CHARS = 300


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """What a cancel did: ``status`` is ``cancelled`` (this call stopped it),
    ``already_finished`` (it had ended, as ``state`` says) or ``not_found``."""

    id: str
    status: str
    state: str | None = None
    kind: str | None = None
    owner: str | None = None
    event: JSONObject | None = None

    def as_dict(self) -> JSONObject:
        return {"id": self.id, "status": self.status, "state": self.state, "kind": self.kind}


@dataclass(frozen=True, slots=True)
class Progress:
    """What a running unit last reported; every field bounded, so a chatty unit cannot bloat
    its row."""

    step: str | None = None
    line: str | None = None
    at: float | None = None

    @classmethod
    def of(cls, step: str | None, line: str | None, at: float) -> Progress:
        return cls(_clip(step, _STEP_CHARS), _clip(last_line(line), _LINE_CHARS), at)

    @classmethod
    def from_column(cls, value: Any) -> Progress | None:
        """The stored column as a record; None when there is none or it is not ours."""
        if not isinstance(value, dict):
            return None
        step, line, at = value.get("step"), value.get("line"), value.get("at")
        return cls(
            step if isinstance(step, str) else None,
            line if isinstance(line, str) else None,
            float(at) if isinstance(at, int | float) and not isinstance(at, bool) else None,
        )

    def merged(self, newer: Progress) -> Progress:
        """This report with ``newer``'s fields where it has them."""
        return Progress(newer.step or self.step, newer.line or self.line, newer.at or self.at)

    def as_column(self) -> JSONObject:
        return {"step": self.step, "line": self.line, "at": self.at}


def last_line(text: str | None) -> str | None:
    """The last non-blank line of ``text``, stripped; None when there is none."""
    if not text:
        return None
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return None


def _in(seconds: float) -> str:
    whole = max(int(seconds), 0)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _clip(text: str | None, limit: int) -> str | None:
    if text is None:
        return None
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_active(state: str | None) -> bool:
    return state is not None and State(state) in ACTIVE_STATES


def is_waiting(row: Mapping[str, Any], now: float) -> bool:
    """A completion stored to be delivered later (a timer not due yet), unclaimed: it can
    still be cancelled, although its work (setting it) has ended."""
    not_before = row.get("not_before")
    return (
        not_before is not None
        and not_before > now
        and row.get("delivery_state") == "pending"
        and row.get("claim_token") is None
    )


def cancelled_event(row: Mapping[str, Any], by: str, now: float) -> JSONObject:
    """The completion event of work stopped by ``by`` (who, on which surface): the notice
    the conversation gets, restating what was stopped."""
    request = dict(row.get("request") or {})
    kind = row.get("kind")
    started = row.get("started_at")
    event: JSONObject = {
        **request,
        "delegation_id" if kind == "delegation" else "delivery_id": row["id"],
        "status": State.CANCELLED.value,
        "error": f"Stopped by {by}" + ("." if started else ", before it started."),
        "cancelled_by": by,
        "completed_at": now,
    }
    event.setdefault("type", ASYNC_DELEGATION if kind == "delegation" else PROCESS_COMPLETION)
    if kind != "delegation":
        event["process_id"] = row["id"]
        event.setdefault("exit_code", None)
        event.setdefault("output_tail", "")
    elif request.get("is_batch"):
        event["results"] = []
    if isinstance(started, int | float):
        key = "total_duration_seconds" if request.get("is_batch") else "duration_seconds"
        event[key] = round(max(now - started, 0.0), 3)
    return event


@dataclass(frozen=True, slots=True)
class BackgroundUnit:
    """A queued or running unit as surfaces show it: what it is, for whom, how long it has
    run, and what it last reported."""

    id: str
    kind: str
    state: str
    goal: str | None
    session_key: str | None
    origin_session_id: str | None
    origin_ui_session_id: str | None
    started_at: float | None
    elapsed_seconds: float
    step: str | None
    line: str | None
    progress_at: float | None
    due_at: float | None = None
    """A wake-up's instant (state ``scheduled``); None for work that runs."""

    @classmethod
    def of(cls, row: LedgerRow, now: float) -> BackgroundUnit:
        progress = Progress.from_column(row.progress) or Progress()
        since = row.started_at or row.created_at
        if row.not_before is not None:
            return cls(
                id=row.id,
                kind=row.kind,
                state=SCHEDULED,
                goal=row.goal,
                session_key=row.session_key,
                origin_session_id=row.origin_session_id,
                origin_ui_session_id=row.origin_ui_session_id,
                started_at=row.created_at,
                elapsed_seconds=round(max(now - row.created_at, 0.0), 1),
                step=f"due in {_in(row.not_before - now)}",
                line=None,
                progress_at=None,
                due_at=row.not_before,
            )
        return cls(
            id=row.id,
            kind=row.kind,
            state=row.state,
            goal=row.goal,
            session_key=row.session_key,
            origin_session_id=row.origin_session_id,
            origin_ui_session_id=row.origin_ui_session_id,
            started_at=row.started_at,
            elapsed_seconds=round(max(now - since, 0.0), 1),
            step=progress.step if row.state == State.RUNNING else "waiting for a free slot",
            line=progress.line,
            progress_at=progress.at,
        )

    def as_dict(self) -> JSONObject:
        return {name: getattr(self, name) for name in self.__slots__}


def active_units(
    views: LedgerViews, now: float, *, session: str | None = None, limit: int = 100
) -> list[BackgroundUnit]:
    """The queued and running units and the wake-ups not due yet (of ``session``: a routing
    key or either origin id), oldest first."""
    rows: list[LedgerRow] = []
    for state in (State.RUNNING, State.QUEUED):
        rows += views.query(RowQuery(state=state.value, session=session, limit=limit))
    for kind in (TIMER_KIND, WAIT_KIND):  # reminders, and wake_when waits not fired yet
        timers = RowQuery(kind=kind, delivery_state="pending", session=session, limit=limit)
        rows += [row for row in views.query(timers) if is_waiting(row.as_dict(), now)]
    rows.sort(key=lambda r: (r.created_at, r.id))
    return [BackgroundUnit.of(row, now) for row in rows[:limit]]
