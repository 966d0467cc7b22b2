"""The Deliveries page's operations over the ledger: list, redeliver, drop; and a session's
unfinished background work (the chat's progress strip).

The same ledger calls as the operator's CLI (``reveille deliveries``): ``Ledger.query``,
``Ledger.redeliver`` (a dropped row goes back to pending with a fresh budget) and
``Ledger.drop`` (a pending row stops being delivered; its result stays). The ledger is the
one of the process's delegation runtime, looked up when called. Blocking: run them off the
event loop.
"""

from __future__ import annotations

from typing import Any

import tools.async_delegation as ad
from api.views import background_view, delivery_view
from delivery.errors import InvalidTransitionError, UnknownDeliveryError
from delivery.ledger import Ledger
from delivery.rows import LedgerRow, RowQuery

__all__ = [
    "DeliveryConflict",
    "UnknownDelivery",
    "drop",
    "get",
    "list_deliveries",
    "redeliver",
    "unfinished_work",
]

STATES = frozenset({"pending", "delivered", "dropped", "superseded"})
DROP_REASON = "dropped from the web UI"


class UnknownDelivery(LookupError):
    """No ledger row has that id; ``pruned`` says when and why retention removed it, when
    it did ("pruned on <date> (...)"), so the page says that instead of "no such delivery"."""

    def __init__(self, delivery_id: str, pruned: str | None = None) -> None:
        super().__init__(delivery_id)
        self.pruned = pruned


class DeliveryConflict(Exception):
    """The row's state does not allow the operation."""


def _ledger() -> Ledger:
    ledger: Ledger = ad.get_runtime().ledger
    return ledger


def _view(ledger: Ledger, row: LedgerRow) -> dict[str, Any]:
    return delivery_view(row, max_attempts=ledger.policy.max_attempts)


def list_deliveries(state: str | None, q: str, limit: int = 200) -> list[dict[str, Any]]:
    ledger = _ledger()
    rows = ledger.query(RowQuery(delivery_state=state, limit=limit))
    needle = q.strip().lower()
    views = [_view(ledger, row) for row in rows]
    if needle:
        views = [
            v
            for v in views
            if any(needle in str(v.get(k) or "").lower() for k in ("id", "summary", "session_id"))
        ]
    return views


def unfinished_work(session_id: str, limit: int = 20) -> list[dict[str, Any]]:
    """The session's background work that has not finished yet (queued or running), oldest
    first."""
    ledger = _ledger()
    rows = [
        row
        for state in ("running", "queued")
        for row in ledger.query(
            RowQuery(session=session_id, state=state, limit=limit, oldest_first=True)
        )
    ]
    rows.sort(key=lambda row: (row.created_at or 0, row.id))
    return [background_view(row) for row in rows[:limit]]


def get(delivery_id: str) -> dict[str, Any]:
    ledger = _ledger()
    try:
        row = ledger.get(delivery_id)
    except (ValueError, UnknownDeliveryError):
        raise UnknownDelivery(delivery_id) from None
    if row is None:
        tomb = ledger.pruned(delivery_id)
        raise UnknownDelivery(delivery_id, tomb.describe() if tomb is not None else None)
    return _view(ledger, row)


def redeliver(delivery_id: str) -> dict[str, Any]:
    ledger = _ledger()
    get(delivery_id)
    try:
        ledger.redeliver(delivery_id, actor="web UI")
    except InvalidTransitionError as exc:
        raise DeliveryConflict(str(exc)) from None
    ledger.notify_others()
    return get(delivery_id)


def drop(delivery_id: str) -> dict[str, Any]:
    ledger = _ledger()
    row = get(delivery_id)
    if not ledger.drop(delivery_id, DROP_REASON):
        raise DeliveryConflict(f"{delivery_id} is {row['state']}, not pending")
    return get(delivery_id)
