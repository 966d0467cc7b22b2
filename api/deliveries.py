"""The Deliveries page's operations over the ledger: list, redeliver, drop; and a session's
unfinished background work (the chat's progress strip).

A search finds a row anywhere in the ledger, each way through an index: by its id (the
primary key), its session (the routing key and the API and web UI origin ids), or the words
of its goal (``RowQuery.text``: every word the start of a word of the goal, "back" finds
"nightly backup"). A web UI restricted to its own sessions (``api.gate``) lists no row of
another surface's session.

The same ledger calls as the operator's CLI (``reveille deliveries``): ``Ledger.query``,
``Ledger.redeliver`` (a dropped row goes back to pending with a fresh budget) and
``Ledger.drop`` (a pending row stops being delivered; its result stays). The ledger is the
one of the process's delegation runtime, looked up when called. Blocking: run them off the
event loop.
"""

from __future__ import annotations

import tools.async_delegation as ad
from agent.messages import JSONObject
from api.views import background_view, delivery_view
from delivery.errors import InvalidTransitionError, UnknownDeliveryError
from delivery.ledger import Ledger
from delivery.rows import LedgerRow, RowQuery
from gateway.config import Platform

__all__ = [
    "DeliveryConflict",
    "UnknownDelivery",
    "drop",
    "get",
    "list_deliveries",
    "of_webui",
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


def _view(ledger: Ledger, row: LedgerRow) -> JSONObject:
    return delivery_view(row, max_attempts=ledger.policy.max_attempts)


def list_deliveries(
    state: str | None, q: str, limit: int = 200, *, webui_only: bool = False
) -> list[JSONObject]:
    """The rows the page lists, newest first (see the module docstring for the search)."""
    ledger = _ledger()
    needle = q.strip()
    if needle:
        found = {row.id: row for row in _indexed_matches(ledger, state, needle, limit)}
        rows = sorted(found.values(), key=lambda r: (r.created_at or 0, r.id), reverse=True)
    else:
        rows = ledger.query(RowQuery(delivery_state=state, limit=limit))
    if webui_only:
        rows = [row for row in rows if _of_webui(row)]
    return [_view(ledger, row) for row in rows[:limit]]


def _indexed_matches(ledger: Ledger, state: str | None, needle: str, limit: int) -> list[LedgerRow]:
    """Rows whose id or session is ``needle``, or whose goal holds its words, from the whole
    ledger, through its indexes."""
    found: list[LedgerRow] = []
    try:
        row = ledger.get(needle)
    except (ValueError, UnknownDeliveryError):
        row = None  # not a ledger id
    if row is not None and (state is None or row.delivery_state == state):
        found.append(row)
    found.extend(ledger.query(RowQuery(delivery_state=state, session=needle, limit=limit)))
    found.extend(ledger.query(RowQuery(delivery_state=state, text=needle, limit=limit)))
    return found


def _of_webui(row: LedgerRow) -> bool:
    """Whether a row is the web UI's to list when it shows only its own sessions: started
    there, or not started by another surface (an API session, a chat platform's routing
    key ``agent:<agent>:<platform>:...``)."""
    if row.origin_ui_session_id:
        return True
    if row.origin_session_id:
        return False
    parts = (row.session_key or "").split(":")
    platform = parts[2] if len(parts) > 2 and parts[0] == "agent" else ""
    return platform not in _OTHER_SURFACES


_OTHER_SURFACES = frozenset(p.value for p in Platform if p is not Platform.WEBUI)


def of_webui(delivery_id: str) -> bool:
    """Whether the row is one a restricted web UI may act on (an unknown id is: the action
    answers 404 for it)."""
    try:
        row = _ledger().get(delivery_id)
    except (ValueError, UnknownDeliveryError):
        return True
    return row is None or _of_webui(row)


def unfinished_work(session_id: str, limit: int = 20) -> list[JSONObject]:
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


def get(delivery_id: str) -> JSONObject:
    ledger = _ledger()
    try:
        row = ledger.get(delivery_id)
    except (ValueError, UnknownDeliveryError):
        raise UnknownDelivery(delivery_id) from None
    if row is None:
        tomb = ledger.pruned(delivery_id)
        raise UnknownDelivery(delivery_id, tomb.describe() if tomb is not None else None)
    return _view(ledger, row)


def redeliver(delivery_id: str) -> JSONObject:
    ledger = _ledger()
    get(delivery_id)
    try:
        ledger.redeliver(delivery_id, actor="web UI")
    except InvalidTransitionError as exc:
        raise DeliveryConflict(str(exc)) from None
    ledger.notify_others()
    return get(delivery_id)


def drop(delivery_id: str) -> JSONObject:
    ledger = _ledger()
    row = get(delivery_id)
    if not ledger.drop(delivery_id, DROP_REASON):
        raise DeliveryConflict(f"{delivery_id} is {row['state']}, not pending")
    return get(delivery_id)
