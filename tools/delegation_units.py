"""The units of detached work a ``tools.delegation_runtime.DelegationRuntime`` runs: what a
dispatch stores and a runner returns, a ``Unit`` and the slots it runs or waits in, the
daemon worker threads, the completion event a finished unit's row gets, and the mark of the
background Response a unit was started by (``RESPONSE_ORIGIN``: cancelling the Response
cancels the units it started).
"""

from __future__ import annotations

import collections
import contextvars
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

from delivery.states import State
from tools.completion_queue import WireEvent

__all__ = [
    "RESPONSE_KEY",
    "RESPONSE_ORIGIN",
    "Clock",
    "DelegationRequest",
    "DispatchOutcome",
    "Runner",
    "RunnerResult",
    "Slots",
    "Unit",
    "WorkerPool",
    "completion_event",
    "rejected",
    "stamp_response_origin",
]

log = logging.getLogger("tools.delegation_runtime")

DelegationRequest = dict[str, Any]
"""What a dispatch stores with its row: the event's fields known before the work runs."""
RunnerResult = dict[str, Any]
"""What a unit's runner returns: ``status``, ``summary`` or ``error``, or ``results[]``."""
Runner = Callable[[], RunnerResult]


class DispatchOutcome(TypedDict):
    """The answer of a dispatch: ``status`` (dispatched, queued, rejected), the
    ``delegation_id``, and ``error`` when rejected."""

    status: Literal["dispatched", "queued", "rejected"]
    delegation_id: str
    error: NotRequired[str]


Clock = Callable[[], float]


_RESULT_STATES = {s.value for s in State} - {State.QUEUED.value, State.RUNNING.value}

RESPONSE_ORIGIN: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "reveille_response_origin", default=None
)
"""The background Response whose turn is running here (``gateway.responses`` sets it): work
dispatched in its context records it (``response_id``), so cancelling the Response cancels
the units it started."""


RESPONSE_KEY = "response_id"


def stamp_response_origin(request: dict[str, Any]) -> None:
    """Record on a unit's request the background Response it was started by, if any."""
    if (response_id := RESPONSE_ORIGIN.get()) is not None:
        request[RESPONSE_KEY] = response_id


@dataclass
class Unit:
    """One unit of detached work (a goal, or a batch holding one slot) and how to stop it."""

    delegation_id: str
    request: DelegationRequest
    run: Runner
    interrupt_fn: Callable[[], None] | None
    cancel_requested: bool = False
    drained: bool = False  # ended ``interrupted`` by a drain; whatever it returns later is moot


@dataclass
class Slots:
    """Running units and the bounded FIFO of those waiting for a slot."""

    running: dict[str, Unit] = field(default_factory=dict)
    waiting: collections.deque[tuple[Unit, int]] = field(default_factory=collections.deque)
    joining: int = 0  # FIFO places reserved while their rows are being written


class WorkerPool:
    """Daemon worker threads, so background work never keeps the process from exiting.

    Threads are started on demand, wait on one C-level queue and leave after being idle.
    """

    _IDLE_EXIT_SECONDS = 30.0

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1  # that idle thread is now spoken for
        self._jobs.put(job)
        if spawn:
            threading.Thread(target=self._work, name="delegation-worker", daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._IDLE_EXIT_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0 and self._jobs.empty():
                        self._idle -= 1
                        return
                continue
            try:
                job()
            except Exception:
                log.exception("delegation worker job failed")
            with self._lock:
                self._idle += 1


def rejected(delegation_id: str, error: str) -> DispatchOutcome:
    """The answer of a dispatch that was refused."""
    return {"status": "rejected", "delegation_id": delegation_id, "error": error}


def completion_event(request: DelegationRequest, result: RunnerResult, started: float) -> WireEvent:
    """The self-contained completion event of a unit that ran from ``started`` until now."""
    now = time.time()
    event = {**request, **{k: v for k, v in result.items() if k not in request}}
    status = str(result.get("status") or "completed")
    if request.get("is_batch"):
        results = result.get("results") or []
        event["results"] = results
        ok = [r for r in results if r.get("status") == "completed"]
        if "status" not in result:
            status = "completed" if results and len(ok) == len(results) else "failed"
        event["total_duration_seconds"] = round(now - started, 3)
    else:
        event["duration_seconds"] = round(now - started, 3)
    if status not in _RESULT_STATES:
        event["error"] = f"runner returned unknown status {status!r}"
        status = "error"
    event["status"] = status
    event["completed_at"] = now
    return event
