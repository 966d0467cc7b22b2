"""What `reveille restore` checks before it says a state directory is usable: every started
unit a transcript names has its ledger row.

A reply that started background work names its handle ("Started in the background …
Handle: deleg_…", "process proc_…"); the ledger row behind it was written before the reply
was stored, so in a consistent copy it is there (or, pruned by retention, its tombstone).
A unit named with no row would never come home: the conversation would wait for it forever.
A backup taken by an older `reveille backup` while servers wrote can hold such units.

``missing_units(ledger, sessions)`` lists them. ``record_lost(ledger, missing)`` is the
repair: each gets a ledger row that ended ``unknown``, with a completion that says the
result was lost with the backup, pending delivery, so the conversation is told once when
a server starts on the restored state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from delivery.events import ASYNC_DELEGATION, PROCESS_COMPLETION
from delivery.ids import unit_handles
from delivery.ledger import Ledger
from delivery.session_backend import SessionRecord, SessionViews
from delivery.states import State

__all__ = ["LOST_ERROR", "MissingUnit", "missing_units", "record_lost"]

LOST_ERROR = (
    "This background work was started just before the backup this server was restored from "
    "was taken, and the backup holds no record of it: whether it ran, and its result, are "
    "unknown, and no result will arrive. Start it again if it is still needed."
)

_PAGE = 500


@dataclass(frozen=True, slots=True)
class MissingUnit:
    """A started unit that ``session`` names and the ledger does not know."""

    handle: str
    session: SessionRecord

    @property
    def kind(self) -> str:
        return "delegation" if self.handle.startswith("deleg_") else "process"


def _sessions(sessions: SessionViews) -> list[SessionRecord]:
    found: list[SessionRecord] = []
    while page := sessions.list_sessions(_PAGE, len(found)):
        found.extend(page)
        if len(page) < _PAGE:
            break
    return found


def _named(sessions: SessionViews, session_id: str) -> list[str]:
    """The handles the replies of one session name (the model's own words; never the
    user's, which may quote anything)."""
    handles: list[str] = []
    after = 0
    while page := sessions.messages(session_id, after, _PAGE):
        handles += [h for m in page if m.role == "assistant" for h in unit_handles(m.content)]
        after = page[-1].id
        if len(page) < _PAGE:
            break
    return list(dict.fromkeys(handles))


def missing_units(ledger: Ledger, sessions: SessionViews) -> list[MissingUnit]:
    """Every started unit a transcript names whose ledger row (or tombstone) is absent."""
    missing = []
    for session in _sessions(sessions):
        for handle in _named(sessions, session.id):
            if ledger.get(handle) is None and ledger.pruned(handle) is None:
                missing.append(MissingUnit(handle, session))
    return missing


def _lost_event(unit: MissingUnit, now: float) -> dict[str, Any]:
    session = unit.session
    ui_session = session.id if (session.source or {}).get("platform") == "webui" else None
    event: dict[str, Any] = {
        "type": ASYNC_DELEGATION if unit.kind == "delegation" else PROCESS_COMPLETION,
        "delegation_id" if unit.kind == "delegation" else "delivery_id": unit.handle,
        "session_key": session.session_key,
        "origin_session_id": session.id,
        "origin_ui_session_id": ui_session,
        "status": str(State.UNKNOWN),
        "error": LOST_ERROR,
        "completed_at": now,
        "abandoned": True,
    }
    if unit.kind == "process":
        event["process_id"] = unit.handle
    return event


def record_lost(ledger: Ledger, missing: list[MissingUnit]) -> None:
    """Give each missing unit a row that ended ``unknown`` with a pending completion."""
    for unit in missing:
        session = unit.session
        event = _lost_event(unit, time.time())
        ledger.create(
            unit.handle,
            kind=unit.kind,
            session_key=session.session_key,
            origin_session_id=session.id,
            origin_ui_session_id=event["origin_ui_session_id"],
            state=State.RUNNING,  # only a running unit can end unknown
        )
        ledger.finish(unit.handle, expected=State.RUNNING, state=State.UNKNOWN, event=event)
