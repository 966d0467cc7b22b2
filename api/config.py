"""The web UI's four per-process maps (names fixed by the delivery contract of seed 002).

Durable truth lives in the ledger and the session store; these maps are caches of this
process only, rebuilt from the ledger after a restart, and safe to clear at any time. Each
is guarded by ``MAPS_LOCK`` because the consumer's wake-up threads and the event loop both
touch them.
"""

from __future__ import annotations

import threading
from typing import Any

MAPS_LOCK = threading.RLock()

PROCESS_SESSION_INDEX: dict[str, str] = {}
"""Background work id (``proc_...``, ``deleg_...``) -> the web UI session that started it."""

PENDING_BG_TASK_COMPLETIONS: dict[str, list[dict[str, Any]]] = {}
"""Web UI session id -> completions that landed while no tab was looking (toast, unread)."""

BG_TASK_COMPLETE_EVENTS_SEEN: dict[str, float] = {}
"""Delivery id -> when this process started its wake-up turn: one wake-up per offer, even
when the same completion is offered twice in a row (restore plus a live event)."""

DEFERRED_PROCESS_WAKEUPS: dict[str, dict[str, dict[str, Any]]] = {}
"""Web UI session id -> {delivery id: event} of wake-ups waiting for the session to be free
(a running turn, a pending approval); their ledger rows stay pending, so a restart re-offers
them."""

__all__ = [
    "BG_TASK_COMPLETE_EVENTS_SEEN",
    "DEFERRED_PROCESS_WAKEUPS",
    "MAPS_LOCK",
    "PENDING_BG_TASK_COMPLETIONS",
    "PROCESS_SESSION_INDEX",
]
