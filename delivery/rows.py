"""The records that cross the storage seam: ``LedgerRow`` (one ledger row, decoded once by
the backend that read it) and ``RowQuery`` (the filters of an operator's ledger query).

Rows are frozen: a reader can hand one on without a copy, and nobody downstream can change
what another reader sees. The field order is the storage order, so the ledger's column list
(``delivery.backend.COLUMNS``) is derived from this class and the SQL backends build a row
from a fetched tuple positionally. Dicts appear only at the edges that promise one (the
public contract of ``tools.async_delegation``, JSON views): ``LedgerRow.as_dict()``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, fields
from typing import TypedDict

from delivery.json_types import JSONObject
from delivery.session_backend import search_terms

__all__ = ["AuditEntry", "LedgerRow", "PendingCounts", "PrunedRow", "RowQuery", "SettledRow"]


class AuditEntry(TypedDict):
    """One entry of a row's audit log (``LedgerViews.audit_log``)."""

    at: float
    action: str
    detail: str


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One ledger row, a column per field (see ``delivery.states`` for the states)."""

    id: str
    kind: str
    state: str
    delivery_state: str
    session_key: str | None
    origin_session_id: str | None
    origin_ui_session_id: str | None
    goal: str | None
    # JSON columns: the work's request until it finishes, then its completion event
    request: JSONObject | None
    event: JSONObject | None
    owner: str | None
    holder: str | None
    created_at: float
    updated_at: float
    started_at: float | None
    completed_at: float | None
    claim_token: str | None
    claim_consumer: str | None
    claimed_at: float | None
    claim_expires_at: float
    delivery_attempts: int
    refunds: int
    next_attempt_at: float
    due_at: float | None
    settled_at: float | None
    settled_reason: str | None
    replay_from: float | None
    restored: int
    # JSON: what a running unit last reported (``step``, ``line``, ``at``; ``delivery.progress``)
    progress: JSONObject | None = None
    # When the completion may first be delivered (a timer's firing instant); None: at once.
    # The rules enforce it through ``next_attempt_at`` (every claim and re-offer reads it);
    # this column says when the row is due for people and for the replay cap.
    not_before: float | None = None
    # The hook an open ``wake_when`` wait listens on (``delivery.inbound``), so an arriving
    # event finds its waits by an index instead of scanning every open wait; None otherwise.
    hook: str | None = None

    def as_dict(self) -> JSONObject:
        """The row as a dict of every column, for edges that promise a dict (shallow: the
        JSON columns are this row's own dicts, so a caller that edits them copies first)."""
        return {name: getattr(self, name) for name in FIELDS}


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(LedgerRow))


@dataclass(frozen=True, slots=True)
class RowQuery:
    """What an operator's ledger query asks for: rows matching every filter given, newest
    first unless ``oldest_first``; ``session`` matches a routing key or either origin id.

    ``text``: words that must all start a word of the goal ("back" finds "nightly backup"),
    matched through each backend's text index over the whole ledger. It is what a person
    typed: only its words count (``terms``), never a quote or an operator, so no input can
    be a syntax error; text without a word matches no row."""

    state: str | None = None
    delivery_state: str | None = None
    session: str | None = None
    kind: str | None = None
    hook: str | None = None
    limit: int = 100
    oldest_first: bool = False
    text: str | None = None

    @property
    def terms(self) -> tuple[str, ...] | None:
        """The words of ``text`` as every backend matches them (lower-cased, letters and
        digits, at most ``delivery.session_backend.MAX_SEARCH_TERMS``); None without text."""
        return None if self.text is None else search_terms(self.text)


@dataclass(frozen=True, slots=True)
class SettledRow:
    """A settled row that retention may prune: what the rule needs to decide, no event.

    ``origin_session_id`` is set for work started over the API: its result lives on as a
    delivery row of that session's transcript, and retention keeps the ledger row while that
    transcript row is not folded into a turn yet (``delivery.retention``)."""

    id: str
    kind: str
    settled_at: float
    origin_session_id: str | None


@dataclass(frozen=True, slots=True)
class PrunedRow:
    """The tombstone a pruned ledger row leaves: when and why it went, and how it had ended,
    so that a late question about it is answered "pruned on <date>" instead of "no such row".
    Tombstones expire in turn (``[retention] tombstone_days``)."""

    id: str
    kind: str
    state: str
    delivery_state: str
    session_key: str | None
    completed_at: float | None
    settled_at: float | None
    pruned_at: float
    reason: str

    def describe(self) -> str:
        """One line for people: "pruned on 2026-12-04 17:00 UTC (<reason>)"."""
        when = dt.datetime.fromtimestamp(self.pruned_at, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        return f"pruned on {when} ({self.reason}); it had ended {self.state}, {self.delivery_state}"


@dataclass(frozen=True, slots=True)
class PendingCounts:
    """The rows that still owe a delivery, as ``/metrics`` reports them.

    ``by_state``: pending rows by lifecycle state (``queued``/``running``: the work has not
    finished; a terminal state: its result is owed to the conversation). ``due_later``: those
    of them whose next delivery is not due yet (backing off after a refused delivery); the
    ledger has no other notion of a row due later.
    """

    by_state: dict[str, int]
    due_later: int
