"""The web UI's four per-process maps (names fixed by the delivery contract of seed 002).

Durable truth lives in the ledger and the session store; these maps are caches of this
process only, rebuilt from the ledger after a restart, and safe to clear at any time. Each
is guarded by ``MAPS_LOCK`` because the consumer's wake-up threads and the event loop both
touch them. Each is bounded (``MAX_ENTRIES`` per map, ``MAX_CARDS`` per session): the ledger
is the deduplication and the record, so dropping the oldest entries loses nothing; writers
go through ``remember``, ``index_session`` and ``add_card``.
"""

from __future__ import annotations

import threading
from typing import TypeVar

from agent.messages import JSONObject

_V = TypeVar("_V")

MAPS_LOCK = threading.RLock()

PROCESS_SESSION_INDEX: dict[str, str] = {}
"""Background work id (``proc_...``, ``deleg_...``) -> the web UI session that started it."""

PENDING_BG_TASK_COMPLETIONS: dict[str, list[JSONObject]] = {}
"""Web UI session id -> completions that landed while no tab was looking (toast, unread)."""

BG_TASK_COMPLETE_EVENTS_SEEN: dict[str, float] = {}
"""Delivery id -> when this process started its wake-up turn. Diagnostics only: what keeps a
wake-up from running twice is the ledger's claim and the turn keyed by its delivery id."""

DEFERRED_PROCESS_WAKEUPS: dict[str, dict[str, JSONObject]] = {}
"""Web UI session id -> {delivery id: event} of wake-ups waiting for the session to be free
(a running turn, a pending approval); their ledger rows stay pending, so a restart re-offers
them."""

MAX_ENTRIES = 4096
MAX_CARDS = 50

__all__ = [
    "BG_TASK_COMPLETE_EVENTS_SEEN",
    "DEFERRED_PROCESS_WAKEUPS",
    "MAPS_LOCK",
    "MAX_CARDS",
    "MAX_ENTRIES",
    "PENDING_BG_TASK_COMPLETIONS",
    "PROCESS_SESSION_INDEX",
    "add_card",
    "index_session",
    "remember",
]


def _bound(mapping: dict[str, _V]) -> None:
    # Dicts keep insertion order: the first keys are the oldest.
    while len(mapping) > MAX_ENTRIES:
        del mapping[next(iter(mapping))]


def remember(delivery_id: str, when: float) -> None:
    """Note that this process started the wake-up of ``delivery_id`` (diagnostics only:
    the ledger decides whether a completion was delivered)."""
    with MAPS_LOCK:
        BG_TASK_COMPLETE_EVENTS_SEEN.pop(delivery_id, None)
        BG_TASK_COMPLETE_EVENTS_SEEN[delivery_id] = when
        _bound(BG_TASK_COMPLETE_EVENTS_SEEN)


def index_session(work_id: str, session_id: str) -> None:
    """Route ``work_id``'s completion to ``session_id`` (work that named its web UI session
    only as an API origin)."""
    with MAPS_LOCK:
        PROCESS_SESSION_INDEX[work_id] = session_id
        _bound(PROCESS_SESSION_INDEX)


def add_card(session_id: str, card: JSONObject) -> None:
    """A completion that landed while no tab looked; the newest ``MAX_CARDS`` are kept."""
    with MAPS_LOCK:
        cards = PENDING_BG_TASK_COMPLETIONS.setdefault(session_id, [])
        cards.append(card)
        del cards[:-MAX_CARDS]
        _bound(PENDING_BG_TASK_COMPLETIONS)
