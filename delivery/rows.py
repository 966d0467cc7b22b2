"""The records that cross the storage seam: ``LedgerRow`` (one ledger row, decoded once by
the backend that read it) and ``RowQuery`` (the filters of an operator's ledger query).

Rows are frozen: a reader can hand one on without a copy, and nobody downstream can change
what another reader sees. The field order is the storage order, so the ledger's column list
(``delivery.backend.COLUMNS``) is derived from this class and the SQL backends build a row
from a fetched tuple positionally. Dicts appear only at the edges that promise one (the
public contract of ``tools.async_delegation``, JSON views): ``LedgerRow.as_dict()``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

__all__ = ["LedgerRow", "RowQuery"]


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
    request: dict[str, Any] | None
    event: dict[str, Any] | None
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

    def as_dict(self) -> dict[str, Any]:
        """The row as a dict of every column, for edges that promise a dict (shallow: the
        JSON columns are this row's own dicts, so a caller that edits them copies first)."""
        return {name: getattr(self, name) for name in FIELDS}


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(LedgerRow))


@dataclass(frozen=True, slots=True)
class RowQuery:
    """What an operator's ledger query asks for: rows matching every filter given, newest
    first unless ``oldest_first``; ``session`` matches a routing key or either origin id."""

    state: str | None = None
    delivery_state: str | None = None
    session: str | None = None
    kind: str | None = None
    limit: int = 100
    oldest_first: bool = False
