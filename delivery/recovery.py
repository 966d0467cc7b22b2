"""The completion events the ledger writes or re-offers on its own, not the work's.

``abandoned_event``: the completion of work whose owner process died before it finished
(recovery of abandoned work). ``mark_reoffered``: a copy of a stored event marked as offered
again (restore, orphan re-offer), so that no new, unrelated session adopts it.
"""

from __future__ import annotations

import copy
from typing import Any

from delivery.states import State


def mark_reoffered(event: dict[str, Any], reason: str, at: float) -> dict[str, Any]:
    """A copy of ``event`` marked as offered again, so no unrelated session adopts it."""
    marked = copy.deepcopy(event)
    marked["_restored"] = True
    marked["_reoffer_reason"] = reason
    marked["_reoffered_at"] = at
    return marked


def abandoned_event(row: dict[str, Any], state: str, now: float) -> dict[str, Any]:
    """The completion event of work whose owner process died before it finished."""
    request = dict(row.get("request") or {})
    never_started = state == State.INTERRUPTED
    event = {
        **request,
        # the claim goes by these ids: never trust the stored request to carry them
        "delegation_id" if row["kind"] == "delegation" else "delivery_id": row["id"],
        "status": str(state),
        "error": (
            "Reveille restarted before this work started; it never ran and can be dispatched again."
            if never_started
            else "Reveille stopped while this work was running; whether it finished or "
            "had effects is unknown."
        ),
        "completed_at": now,
        "abandoned": True,
    }
    event.setdefault("type", "async_delegation" if row["kind"] == "delegation" else "completion")
    started = row.get("started_at") or row.get("created_at")
    if started:
        event["duration_seconds"] = round(max(now - started, 0.0), 3)
    return event
