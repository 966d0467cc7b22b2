"""Detached sub-agent work and the durable delivery contract every front end uses.

Dispatch: ``dispatch_async_delegation`` writes the ledger row first (a failed write rejects
the dispatch), then runs ``runner`` on a daemon worker; at most ``max_async_children``
units run at once, and beyond that a dispatch waits in a bounded FIFO or is rejected. When
the runner returns, the terminal state and the completion event are written to the ledger
BEFORE the event is put on ``process_registry.completion_queue``.

Delivery: a consumer claims an event before handing it on, acknowledges it only after the
hand-off was accepted, and otherwise releases it (``retryable=True`` when the refusal was
transient). Those calls, and restore after a restart, are the public contract of SPEC.md.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from delivery.errors import LedgerError, LedgerUnavailable
from delivery.ids import new_id
from delivery.ledger import Ledger
from delivery.policy import DeliveryPolicy
from delivery.reoffer import ReofferScheduler
from delivery.sqlite_backend import SqliteBackend
from delivery.states import State

log = logging.getLogger(__name__)

EVENT_TYPE = "async_delegation"
DEFAULT_MAX_QUEUED = 32
_FINALIZE_RETRY_SECONDS = (0.05, 0.2, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_RESULT_STATES = {s.value for s in State} - {State.QUEUED.value, State.RUNNING.value}


@dataclass
class _Unit:
    delegation_id: str
    request: dict[str, Any]
    run: Callable[[], dict[str, Any]]
    interrupt_fn: Callable[[], None] | None
    cancel_requested: bool = False


@dataclass
class _Slots:
    """Running units and the bounded FIFO of those waiting for a slot."""

    running: dict[str, _Unit] = field(default_factory=dict)
    waiting: collections.deque[tuple[_Unit, int]] = field(default_factory=collections.deque)
    joining: int = 0  # FIFO places reserved while their rows are being written


class _WorkerPool:
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


class DelegationRuntime:
    """The ledger, the completion queue and the slots of this process."""

    def __init__(
        self,
        ledger: Ledger,
        completion_queue: Any,
        *,
        max_queued: int = DEFAULT_MAX_QUEUED,
    ) -> None:
        self.ledger = ledger
        self.queue = completion_queue
        self.max_queued = max_queued
        self._slots = _Slots()
        self._lock = threading.Lock()
        self._pool = _WorkerPool()
        self.scheduler: ReofferScheduler | None = None

    # -- dispatch -----------------------------------------------------------------------------

    def dispatch(self, unit: _Unit, *, kind: str, goal: str, cap: int) -> dict[str, Any]:
        if cap < 1:
            raise ValueError("max_async_children must be at least 1")
        with self._lock:
            start_now = len(self._slots.running) < cap
            waiting = len(self._slots.waiting) + self._slots.joining
            if not start_now and waiting >= self.max_queued:
                return _rejected(
                    unit.delegation_id,
                    f"{len(self._slots.running)} background tasks are running and "
                    f"{waiting} are waiting (the limit); try again later",
                )
            # Reserve the slot, or a place in the FIFO, before the write, so that concurrent
            # dispatches cannot overshoot the cap while their rows are being written. A
            # waiting unit joins the FIFO only once its row exists: a slot freed meanwhile
            # must not try to start a row that is not there yet.
            if start_now:
                self._slots.running[unit.delegation_id] = unit
            else:
                self._slots.joining += 1
        req = unit.request
        try:
            self.ledger.create(
                unit.delegation_id,
                kind=kind,
                state=State.RUNNING if start_now else State.QUEUED,
                session_key=req.get("session_key"),
                origin_session_id=req.get("origin_session_id"),
                origin_ui_session_id=req.get("origin_ui_session_id"),
                goal=goal,
                request=req,
            )
        except (LedgerError, OSError) as exc:
            with self._lock:
                if start_now:
                    self._slots.running.pop(unit.delegation_id, None)
                else:
                    self._slots.joining -= 1
            if start_now:
                self._fill_slots()
            return _rejected(unit.delegation_id, f"could not record the task durably: {exc}")
        if start_now:
            self._pool.submit(lambda: self._run(unit))
            return {"status": "dispatched", "delegation_id": unit.delegation_id}
        with self._lock:
            self._slots.joining -= 1
            self._slots.waiting.append((unit, cap))
        self._fill_slots()  # a slot may have freed while the row was being written
        return {"status": "queued", "delegation_id": unit.delegation_id}

    def _remove_waiting(self, delegation_id: str) -> _Unit | None:
        for item in self._slots.waiting:
            if item[0].delegation_id == delegation_id:
                self._slots.waiting.remove(item)
                return item[0]
        return None

    def _fill_slots(self) -> None:
        while True:
            with self._lock:
                if not self._slots.waiting:
                    return
                unit, cap = self._slots.waiting[0]
                if len(self._slots.running) >= cap:
                    return
                self._slots.waiting.popleft()
                self._slots.running[unit.delegation_id] = unit
            try:
                started = self.ledger.start(unit.delegation_id)
            except LedgerError:
                log.exception("could not start queued delegation %s", unit.delegation_id)
                started = False
            if started:
                self._pool.submit(lambda unit=unit: self._run(unit))
            else:
                with self._lock:
                    self._slots.running.pop(unit.delegation_id, None)

    def _run(self, unit: _Unit) -> None:
        started = time.time()
        try:
            result = unit.run()
            if not isinstance(result, dict):
                result = {"status": "error", "error": f"runner returned {type(result).__name__}"}
        except Exception as exc:
            log.exception("delegation %s failed", unit.delegation_id)
            result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
        if unit.cancel_requested:
            result = {**result, "status": "cancelled"}
        event = _completion_event(unit.request, result, started)
        # The work is done: its slot is free now, while the terminal row is written.
        with self._lock:
            self._slots.running.pop(unit.delegation_id, None)
        self.record_completion(unit.delegation_id, event)
        self._fill_slots()

    def record_completion(
        self,
        row_id: str,
        event: dict[str, Any],
        *,
        deliver_to: Any = None,
        attempt: int = 0,
    ) -> None:
        """Write the terminal row, then (from the writer's commit callback) queue the event.

        Returns at once: one commit carries many workers' results. A write that fails for
        want of the database is retried, since the event may be the only copy of the result.
        The event goes to ``deliver_to`` (default: this runtime's queue) only when the row
        still waits for delivery; a row dropped while its work ran keeps the result only.
        """
        target = self.queue if deliver_to is None else deliver_to
        fut = self.ledger.submit_finish(
            row_id, expected="running", state=event["status"], event=event
        )

        def committed(done: Any) -> None:
            exc = done.exception()
            if exc is None:
                if done.result():
                    target.put(event)
                return
            if isinstance(exc, LedgerUnavailable) and attempt < len(_FINALIZE_RETRY_SECONDS):
                delay = _FINALIZE_RETRY_SECONDS[attempt]
                log.warning("ledger unavailable finishing %s, retry in %ss: %s", row_id, delay, exc)
                timer = threading.Timer(
                    delay,
                    self.record_completion,
                    args=(row_id, event),
                    kwargs={"deliver_to": target, "attempt": attempt + 1},
                )
                timer.daemon = True
                timer.start()
            else:
                log.critical("could not record the completion of %s: %s", row_id, exc)

        fut.add_done_callback(committed)

    # -- control ----------------------------------------------------------------------------

    def interrupt(self, delegation_id: str, *, cancel: bool = False) -> bool:
        with self._lock:
            unit = self._slots.running.get(delegation_id)
            waiting = None if unit else self._remove_waiting(delegation_id)
        if waiting is not None:
            event = _completion_event(
                waiting.request,
                {"status": "cancelled", "error": "cancelled before it started"},
                time.time(),
            )
            if self.ledger.finish(delegation_id, expected="queued", state="cancelled", event=event):
                self.queue.put(event)
            return True
        if unit is None:
            return False
        unit.cancel_requested = cancel or unit.cancel_requested
        if unit.interrupt_fn is not None:
            unit.interrupt_fn()
        return True

    def running_count(self) -> int:
        with self._lock:
            return len(self._slots.running)

    def waiting_count(self) -> int:
        with self._lock:
            return len(self._slots.waiting)

    # -- background re-offers -------------------------------------------------------------

    def start_scheduler(self) -> ReofferScheduler:
        if self.scheduler is None:
            self.scheduler = ReofferScheduler(self.ledger, self.queue.put)
            self.scheduler.start()
        return self.scheduler

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
            self.scheduler = None
        self.ledger.close()


def _rejected(delegation_id: str, error: str) -> dict[str, Any]:
    return {"status": "rejected", "delegation_id": delegation_id, "error": error}


def _completion_event(
    request: dict[str, Any], result: dict[str, Any], started: float
) -> dict[str, Any]:
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


# -- the process's runtime -------------------------------------------------------------------

_runtime: DelegationRuntime | None = None
_runtime_lock = threading.Lock()


def _open_runtime(
    path: str,
    policy: DeliveryPolicy | None,
    completion_queue: Any,
    max_queued: int,
    clock: Callable[[], float] = time.time,
) -> DelegationRuntime:
    from tools.process_registry import process_registry

    if completion_queue is None:
        completion_queue = process_registry.completion_queue
    ledger = Ledger(SqliteBackend(path), policy, clock=clock)
    return DelegationRuntime(ledger, completion_queue, max_queued=max_queued)


def get_runtime() -> DelegationRuntime:
    """This process's runtime, opened on first use from the settings (``REVEILLE_HOME``)."""
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                from reveille.settings import load_settings

                settings = load_settings()
                _runtime = _open_runtime(
                    str(settings.ledger_path),
                    settings.delivery_policy,
                    None,
                    settings.max_queued_delegations,
                )
    return _runtime


def runtime_is_open() -> bool:
    """Whether this process's runtime was opened (by ``get_runtime`` or ``configure_runtime``)."""
    return _runtime is not None


def configure_runtime(
    path: str,
    *,
    policy: DeliveryPolicy | None = None,
    completion_queue: Any = None,
    max_queued: int = DEFAULT_MAX_QUEUED,
    clock: Callable[[], float] = time.time,
) -> DelegationRuntime:
    """Open the runtime on an explicit ledger file (tests, benchmarks, embedding)."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.close()
        _runtime = _open_runtime(path, policy, completion_queue, max_queued, clock)
        return _runtime


def reset_runtime() -> None:
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.close()
        _runtime = None


# -- dispatch API ------------------------------------------------------------------------------


def _new_id() -> str:
    return new_id("deleg_")


def _base_request(
    delegation_id: str,
    *,
    context: str | None,
    toolsets: list[str] | None,
    role: str | None,
    model: str | None,
    session_key: str | None,
    origin_session_id: str | None,
    origin_ui_session_id: str | None,
    parent_session_id: str | None,
) -> dict[str, Any]:
    for name, value in (
        ("session_key", session_key),
        ("origin_session_id", origin_session_id),
        ("origin_ui_session_id", origin_ui_session_id),
        ("context", context),
        ("role", role),
        ("model", model),
    ):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a string")
    if toolsets is not None and (
        not isinstance(toolsets, list) or not all(isinstance(t, str) for t in toolsets)
    ):
        raise TypeError("toolsets must be a list of strings")
    return {
        "type": EVENT_TYPE,
        "delegation_id": delegation_id,
        "session_key": session_key,
        "origin_session_id": origin_session_id,
        "origin_ui_session_id": origin_ui_session_id,
        "parent_session_id": parent_session_id,
        "context": context,
        "toolsets": toolsets or [],
        "role": role,
        "model": model,
        "dispatched_at": time.time(),
    }


def dispatch_async_delegation(
    *,
    goal: str,
    context: str | None = None,
    toolsets: list[str] | None = None,
    role: str | None = None,
    model: str | None = None,
    session_key: str | None = None,
    runner: Callable[[], dict[str, Any]],
    interrupt_fn: Callable[[], None] | None = None,
    max_async_children: int = 3,
    origin_session_id: str | None = None,
    origin_ui_session_id: str | None = None,
    parent_session_id: str | None = None,
) -> dict[str, Any]:
    """Start one background task; returns at once with dispatched | queued | rejected."""
    if not isinstance(goal, str) or not goal.strip():
        raise ValueError("goal must be a non-empty string")
    if not callable(runner):
        raise TypeError("runner must be a zero-argument callable returning a dict")
    delegation_id = _new_id()
    request = _base_request(
        delegation_id,
        context=context,
        toolsets=toolsets,
        role=role,
        model=model,
        session_key=session_key,
        origin_session_id=origin_session_id,
        origin_ui_session_id=origin_ui_session_id,
        parent_session_id=parent_session_id,
    )
    request["goal"] = goal
    unit = _Unit(delegation_id, request, runner, interrupt_fn)
    return get_runtime().dispatch(unit, kind="delegation", goal=goal, cap=max_async_children)


def dispatch_async_delegation_batch(
    *,
    goals: list[str],
    context: str | None = None,
    toolsets: list[str] | None = None,
    role: str | None = None,
    model: str | None = None,
    session_key: str | None = None,
    runner: Callable[[], dict[str, Any]] | None = None,
    runners: list[Callable[[], dict[str, Any]]] | None = None,
    interrupt_fn: Callable[[], None] | None = None,
    max_async_children: int = 3,
    origin_session_id: str | None = None,
    origin_ui_session_id: str | None = None,
    parent_session_id: str | None = None,
) -> dict[str, Any]:
    """Start several goals as ONE unit holding one slot; one completion with ``results[]``.

    Give either ``runner`` (returns ``{"results": [...]}``) or ``runners``, one per goal,
    run in order inside the slot.
    """
    if (
        not isinstance(goals, list)
        or not goals
        or not all(isinstance(g, str) and g.strip() for g in goals)
    ):
        raise ValueError("goals must be a non-empty list of non-empty strings")
    if (runner is None) == (runners is None):
        raise TypeError("give exactly one of runner or runners")
    if runners is not None and len(runners) != len(goals):
        raise ValueError("runners must have one callable per goal")
    delegation_id = _new_id()
    request = _base_request(
        delegation_id,
        context=context,
        toolsets=toolsets,
        role=role,
        model=model,
        session_key=session_key,
        origin_session_id=origin_session_id,
        origin_ui_session_id=origin_ui_session_id,
        parent_session_id=parent_session_id,
    )
    request.update(goals=goals, is_batch=True)

    def run_batch() -> dict[str, Any]:
        if runner is not None:
            return runner()
        results = []
        for index, task in enumerate(runners or []):
            started = time.time()
            try:
                out = task()
            except Exception as exc:
                out = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
            results.append(
                {
                    "task_index": index,
                    "goal": goals[index],
                    "duration_seconds": round(time.time() - started, 3),
                    **out,
                }
            )
        return {"results": results}

    unit = _Unit(delegation_id, request, run_batch, interrupt_fn)
    summary = f"batch of {len(goals)}: {goals[0]}"
    return get_runtime().dispatch(unit, kind="delegation", goal=summary, cap=max_async_children)


def interrupt_delegation(delegation_id: str) -> bool:
    """Ask a running unit to stop (its runner's ``interrupt_fn``); a waiting one is cancelled."""
    return get_runtime().interrupt(delegation_id)


def cancel_delegation(delegation_id: str) -> bool:
    """Cancel: a waiting unit never starts; a running one is interrupted and ends cancelled."""
    return get_runtime().interrupt(delegation_id, cancel=True)


def list_delegations(
    *, session: str | None = None, state: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    return get_runtime().ledger.query(kind="delegation", session=session, state=state, limit=limit)


# -- the delivery contract ---------------------------------------------------------------------


def _delivery_id(evt: Any) -> str | None:
    """The ledger id an event is claimed under, or None for types that need no claim."""
    if not isinstance(evt, dict):
        raise TypeError(f"a completion event must be a dict, not {type(evt).__name__}")
    kind = evt.get("type")
    if kind == EVENT_TYPE:
        row_id = evt.get("delegation_id")
        if row_id is None:
            raise ValueError("async_delegation event has no delegation_id")
    else:
        row_id = evt.get("delivery_id")
        if row_id is None:
            return None
    if not isinstance(row_id, str) or not row_id:
        raise TypeError("the event's delegation_id/delivery_id must be a non-empty string")
    return row_id


def claim_event_delivery(evt: dict[str, Any], consumer: str) -> str | None:
    """A claim token; "" for event types that need none; None when held or settled."""
    row_id = _delivery_id(evt)
    if row_id is None:
        return ""
    return get_runtime().ledger.claim(row_id, consumer)


def complete_event_delivery(evt: dict[str, Any], claim: str | None) -> bool:
    """Acknowledge: the hand-off was accepted. Only the claim's holder can."""
    row_id = _delivery_id(evt)
    if row_id is None:
        return True
    if not claim:
        raise ValueError("complete_event_delivery needs the claim token claim_event_delivery gave")
    return get_runtime().ledger.complete(row_id, claim)


def release_event_delivery(
    evt: dict[str, Any], claim: str | None, *, retryable: bool = False
) -> str:
    """Give the claim back; ``retryable=True`` refunds the attempt (transient refusal)."""
    row_id = _delivery_id(evt)
    if row_id is None:
        return "pending"
    if not claim:
        raise ValueError("release_event_delivery needs the claim token claim_event_delivery gave")
    return get_runtime().ledger.release(row_id, claim, retryable=retryable)


def drop_event_delivery(evt: dict[str, Any], claim: str | None, reason: str) -> bool:
    """The target is gone for good (session deleted, user reset): dropped, never delivered."""
    row_id = _delivery_id(evt)
    if row_id is None:
        return False
    return get_runtime().ledger.drop(row_id, reason, token=claim or None)


def get_durable_delegation(delegation_id: str) -> dict[str, Any] | None:
    """The row as a dict (``delivery_state``, ``delivery_attempts``, the event ...), or None."""
    return get_runtime().ledger.get(delegation_id)


def restore_undelivered_completions(completion_queue: Any) -> int:
    """After a restart: re-offer every pending completion (oldest first) on the queue."""
    events = get_runtime().ledger.restore()
    for event in events:
        completion_queue.put(event)
    return len(events)


# -- the same contract for asyncio consumers: no thread hop, the writer's future is awaited --


async def aclaim_event_delivery(evt: dict[str, Any], consumer: str) -> str | None:
    row_id = _delivery_id(evt)
    if row_id is None:
        return ""
    return await get_runtime().ledger.aclaim(row_id, consumer)


async def acomplete_event_delivery(evt: dict[str, Any], claim: str | None) -> bool:
    row_id = _delivery_id(evt)
    if row_id is None:
        return True
    if not claim:
        raise ValueError("complete_event_delivery needs the claim token claim_event_delivery gave")
    return await get_runtime().ledger.acomplete(row_id, claim)


async def arelease_event_delivery(
    evt: dict[str, Any], claim: str | None, *, retryable: bool = False
) -> str:
    row_id = _delivery_id(evt)
    if row_id is None:
        return "pending"
    if not claim:
        raise ValueError("release_event_delivery needs the claim token claim_event_delivery gave")
    return await get_runtime().ledger.arelease(row_id, claim, retryable=retryable)
