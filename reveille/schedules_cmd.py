"""`reveille schedules`: what is scheduled to wake a conversation, and stopping it.

``list`` shows what is still to come: recurring schedules (active or paused) and the one-shot
reminders of ``schedule_wakeup`` not due yet; ``--all`` adds what fired, was missed or was
cancelled. Each line starts with its id and shows the kind and state, the next due time in
the schedule's own zone, the conversation and the note. ``cancel ID`` stops a schedule or a
reminder, ``pause ID`` / ``resume ID`` a schedule; every server sharing the store sees it at
once (the occurrence row is settled in the ledger, which no server fires afterwards).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import storage
from delivery.cancel import CANCELLED as CANCEL_DONE
from delivery.errors import LedgerError
from delivery.events import TIMER_KIND
from delivery.ledger import Ledger
from delivery.rows import LedgerRow, RowQuery
from delivery.schedules import SCHEDULE_KIND, Schedule, ScheduleError
from delivery.schedules_engine import MISSED_STATUS, ScheduleEngine, ScheduleNotFound
from reveille.background import who
from reveille.deliveries import clip, text_table, with_ledger
from reveille.settings import Settings, load_settings

__all__ = ["Entry", "add_parser", "entries", "run"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "schedules",
        help="list what is scheduled (schedules and reminders), or cancel, pause, resume one",
        description="Recurring schedules and one-shot reminders the agent set.",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = sub.add_parser("list", help="what is still to come (--all: also what fired or stopped)")
    ls.add_argument("--all", action="store_true", help="add what fired, was missed or cancelled")
    ls.add_argument("--session", help="session key, API session id or web UI session id")
    ls.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    for name, text in (
        ("cancel", "stop a schedule or a reminder for good"),
        ("pause", "stop a schedule's occurrences until resumed"),
        ("resume", "start a paused schedule again from now"),
    ):
        sub.add_parser(name, help=text).add_argument("id")
    parser.set_defaults(func=run)


@dataclass(frozen=True, slots=True)
class Entry:
    """One line of the list: a schedule, a reminder, or (``--all``) a past occurrence."""

    id: str
    kind: str
    state: str
    next_due: str
    session: str
    note: str

    def as_dict(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in self.__slots__}


def _when(at: float | None, zone: str = "UTC") -> str:
    if at is None:
        return ""
    return datetime.fromtimestamp(at, ZoneInfo(zone)).isoformat(timespec="seconds") + f" {zone}"


def _schedule_entry(s: Schedule) -> Entry:
    spec = s.cron if s.cron is not None else f"every {s.every_seconds:g}s"
    return Entry(
        s.id, f"schedule ({spec})", s.state, _when(s.next_at, s.zone), s.session or "", s.note
    )


def _row_entry(row: LedgerRow, now: float) -> Entry:
    event = row.event or {}
    zone = str(event.get("zone") or "UTC")
    try:
        ZoneInfo(zone)
    except (ValueError, KeyError):
        zone = "UTC"  # a reminder set with a bare offset names no IANA zone
    due = row.not_before
    if row.delivery_state == "pending" and due is not None and due > now:
        state = "scheduled"
    elif row.state == "cancelled" or (row.settled_reason and "cancel" in row.settled_reason):
        state = "cancelled"
    elif event.get("status") == MISSED_STATUS:
        state = "missed"
    elif row.delivery_state == "pending":
        state = "firing"
    else:
        state = "fired"
    kind = "reminder" if row.kind == TIMER_KIND else "occurrence"
    session = row.origin_ui_session_id or row.origin_session_id or row.session_key or ""
    return Entry(row.id, kind, state, _when(due, zone), session, str(event.get("note") or ""))


def entries(
    engine: ScheduleEngine, *, session: str | None, everything: bool, now: float
) -> list[Entry]:
    """What ``list`` shows (see the module docstring)."""
    out = [_schedule_entry(s) for s in engine.find(session=session, include_cancelled=everything)]
    views = engine.ledger.views
    pending = views.query(
        RowQuery(kind=TIMER_KIND, delivery_state="pending", session=session, limit=500)
    )
    reminders = [r for r in pending if r.not_before is not None and r.not_before > now]
    out += [_row_entry(r, now) for r in sorted(reminders, key=lambda r: r.not_before or 0.0)]
    if everything:
        past: list[LedgerRow] = []
        for kind in (TIMER_KIND, SCHEDULE_KIND):
            rows = views.query(RowQuery(kind=kind, session=session, limit=200))
            past += [r for r in rows if r not in reminders and r.delivery_state != "pending"]
        out += [_row_entry(r, now) for r in sorted(past, key=lambda r: -(r.not_before or 0.0))]
    return out


def _open_engine(settings: Settings, ledger: Ledger) -> ScheduleEngine:
    if settings.database_url:
        location = storage.open_storage(settings.database_url, migrate=False)
    else:
        location = storage.sqlite_files(ledger=settings.ledger_path)
    return ScheduleEngine(ledger, location.open_schedules())


def run(args: argparse.Namespace) -> int:
    settings = load_settings()
    if not settings.database_url and not settings.ledger_path.exists():
        print(f"no ledger at {settings.ledger_path} yet (REVEILLE_HOME={settings.home})")
        return 0 if args.action == "list" else 1

    def act(ledger: Ledger) -> int:
        engine = _open_engine(settings, ledger)
        try:
            return _act(engine, args)
        finally:
            engine.store.close()

    return with_ledger(settings, "schedules", act)


def _act(engine: ScheduleEngine, args: argparse.Namespace) -> int:
    if args.action == "list":
        found = entries(engine, session=args.session, everything=args.all, now=time.time())
        if args.json:
            for entry in found:
                print(json.dumps(entry.as_dict()))
        elif found:
            headers = ("ID", "KIND", "STATE", "NEXT DUE", "CONVERSATION", "NOTE")
            rows = [
                (e.id, e.kind, e.state, e.next_due, clip(e.session, 36), clip(e.note, 60))
                for e in found
            ]
            print(text_table(headers, rows))
        else:
            print("nothing is scheduled")
        return 0
    schedule_id: str = args.id
    if not schedule_id.startswith("sch_") and args.action == "cancel":
        return _cancel_reminder(engine.ledger, schedule_id)
    step: dict[str, Callable[[str], Schedule]] = {
        "cancel": lambda i: engine.cancel(i, by=who()),
        "pause": lambda i: engine.pause(i, by=who()),
        "resume": engine.resume,
    }
    try:
        done = step[args.action](schedule_id)
    except ScheduleNotFound:
        print(f"error: no schedule {schedule_id!r}", file=sys.stderr)
        return 1
    except (ScheduleError, LedgerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    engine.ledger.notify_others()
    nxt = f"; next at {_when(done.next_at, done.zone)}" if done.next_at is not None else ""
    print(f"{done.id}: {done.state}{nxt}")
    return 0


def _cancel_reminder(ledger: Ledger, row_id: str) -> int:
    row = ledger.get(row_id)
    if row is None or row.kind != TIMER_KIND:
        print(f"error: no schedule or reminder {row_id!r}", file=sys.stderr)
        return 1
    outcome = ledger.cancel(row_id, by=who(), deliver_here=False)
    if outcome.status == CANCEL_DONE:
        ledger.notify_others()
        print(f"{row_id}: cancelled")
        return 0
    print(f"{row_id}: already fired; nothing to cancel")
    return 0
