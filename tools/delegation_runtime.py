"""The delegation runtime: the ledger, the completion queue and the slots of this process.

``DelegationRuntime`` runs detached units (a sub-agent, a batch of them) on daemon workers:
at most ``cap`` run at once and beyond that a unit waits in a bounded FIFO or is rejected.
Every unit's ledger row is written before it can start, and its completion event is written
to the ledger before it is put on the completion queue (``record_completion``).

Stopping and progress (``delivery.cancel``): ``cancel`` settles a row ``cancelled`` from any
process; the work running here is registered with ``watch`` (a unit, a background command)
and stopped when its row turns out cancelled, at once when the cancel is made here, else at
the re-offer scheduler's next pass (every cancel pokes the store's servers) or at its next
progress write. ``report_progress`` (from a unit's thread) and ``progress`` record what the
work is doing; the runtime writes it to the store at most once per second.

The bottom of this module holds the process-wide runtime behind ``get_runtime()``, the face
that the fixed contract module (``tools.async_delegation``) and the background processes
need. The composition root says how it is opened (``register_runtime_factory``); without
one, it is opened on ``$REVEILLE_HOME/ledger.db`` (default ``~/.reveille``) with the default
delivery policy. ``configure_runtime`` opens it on an explicit file instead.

What a unit is, the worker threads and the completion event are ``tools.delegation_units``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

from delivery import traces
from delivery.backend import LedgerStore
from delivery.cancel import CANCELLED, CancelOutcome
from delivery.errors import LedgerError, LedgerUnavailable
from delivery.ledger import Ledger
from delivery.policy import DeliveryPolicy
from delivery.reoffer import ReofferScheduler
from delivery.rows import RowQuery
from delivery.states import State
from delivery.write_future import WriteFuture
from tools.completion_queue import EventQueue, WireEvent, shared_completion_queue
from tools.delegation_units import (
    RESPONSE_KEY,
    RESPONSE_ORIGIN,
    Clock,
    DelegationRequest,
    DispatchOutcome,
    Runner,
    RunnerResult,
    Slots,
    Unit,
    WorkerPool,
    completion_event,
    rejected,
    stamp_response_origin,
)
from tools.watched_work import PROGRESS_INTERVAL_SECONDS, WatchedWork

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUED = 32
LEDGER_FILE = "ledger.db"
_FINALIZE_RETRY_SECONDS = (0.05, 0.2, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "LEDGER_FILE",
    "PROGRESS_INTERVAL_SECONDS",
    "RESPONSE_KEY",
    "RESPONSE_ORIGIN",
    "DelegationRequest",
    "DelegationRuntime",
    "DispatchOutcome",
    "Runner",
    "RunnerResult",
    "RuntimeFactory",
    "Unit",
    "configure_runtime",
    "current_unit",
    "default_state_dir",
    "get_runtime",
    "open_runtime",
    "register_runtime_factory",
    "report_progress",
    "reset_runtime",
    "runtime_is_open",
    "stamp_response_origin",
]

_current = threading.local()  # the unit a worker thread is running (``report_progress``)


class DelegationRuntime:
    """The ledger, the completion queue and the slots of this process."""

    def __init__(
        self,
        ledger: Ledger,
        completion_queue: EventQueue,
        *,
        max_queued: int = DEFAULT_MAX_QUEUED,
    ) -> None:
        self.ledger = ledger
        self.queue = completion_queue
        self.max_queued = max_queued
        self._slots = Slots()
        self._lock = threading.Lock()
        self._pool = WorkerPool()
        self.scheduler: ReofferScheduler | None = None
        self.draining = False
        # How to stop the work running here once its row is cancelled, and its progress.
        self.watched = WatchedWork(ledger)
        # Rows whose work goes on without this server (an MCP task its server keeps).
        self._outliving: set[str] = set()
        # Finished work whose terminal row is still being written (its event not yet queued):
        # a drain waits for these as for running work.
        self._recording = 0

    # -- dispatch -----------------------------------------------------------------------------

    def dispatch(
        self, unit: Unit, *, kind: str, goal: str, cap: int, max_queued: int | None = None
    ) -> DispatchOutcome:
        """Start ``unit`` now (under ``cap`` running), queue it in the FIFO, or reject it.

        ``max_queued`` lowers the runtime's FIFO bound for this call (never raises it).
        """
        if cap < 1:
            raise ValueError("max_async_children must be at least 1")
        if max_queued is not None and max_queued < 0:
            raise ValueError("max_queued_delegations must not be negative")
        limit = self.max_queued if max_queued is None else min(self.max_queued, max_queued)
        if self.draining:
            return rejected(
                unit.delegation_id,
                "the server is restarting and takes no new background work; try again shortly",
            )
        with self._lock:
            start_now = len(self._slots.running) < cap
            waiting = len(self._slots.waiting) + self._slots.joining
            if not start_now and waiting >= limit:
                return rejected(
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
        stamp_response_origin(req)
        if traceparent := traces.turn_traceparent():
            req[traces.TRACEPARENT] = traceparent  # stored: the wake-up's span links to it
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
            return rejected(unit.delegation_id, f"could not record the task durably: {exc}")
        where = req.get("origin_ui_session_id") or req.get("session_key") or "-"
        if start_now:
            log.info("background %s %s started (session %s)", kind, unit.delegation_id, where)
            self._pool.submit(functools.partial(self._run, unit))
            return {"status": "dispatched", "delegation_id": unit.delegation_id}
        log.info("background %s %s queued (session %s)", kind, unit.delegation_id, where)
        with self._lock:
            self._slots.joining -= 1
            self._slots.waiting.append((unit, cap))
        self._fill_slots()  # a slot may have freed while the row was being written
        return {"status": "queued", "delegation_id": unit.delegation_id}

    def _remove_waiting(self, delegation_id: str) -> Unit | None:
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
                self._pool.submit(functools.partial(self._run, unit))
            else:
                with self._lock:
                    self._slots.running.pop(unit.delegation_id, None)

    def _run(self, unit: Unit) -> None:
        started = time.time()
        self.watch(unit.delegation_id, functools.partial(self._stop_unit, unit))
        _current.unit = (self, unit.delegation_id)
        try:
            result = unit.run()
            if not isinstance(result, dict):
                result = {"status": "error", "error": f"runner returned {type(result).__name__}"}
        except Exception as exc:
            log.exception("delegation %s failed", unit.delegation_id)
            result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
        finally:
            _current.unit = None
            self.unwatch(unit.delegation_id)
            with self._lock:
                self._outliving.discard(unit.delegation_id)
        if unit.cancel_requested:
            result = {**result, "status": "cancelled"}
        event = completion_event(unit.request, result, started)
        log.info(
            "background %s finished: %s in %.1f s",
            unit.delegation_id,
            event.get("status"),
            time.time() - started,
        )
        if not unit.drained:
            traces.record_background(
                "delegation", unit.delegation_id, unit.request, started, str(event.get("status"))
            )
        # The work is done: its slot is free now, while the terminal row is written.
        with self._lock:
            self._slots.running.pop(unit.delegation_id, None)
        if unit.drained:
            # The drain stopped it and writes its row (``interrupted``: the server was
            # restarting); the stopped run's own answer must not win that write.
            return
        self.record_completion(unit.delegation_id, event)
        self._fill_slots()

    def record_completion(
        self,
        row_id: str,
        event: WireEvent,
        *,
        deliver_to: EventQueue | None = None,
        attempt: int = 0,
        on_recorded: Callable[[], None] | None = None,
    ) -> None:
        """Write the terminal row, then (from the writer's commit callback) queue the event.

        Returns at once: one commit carries many workers' results. A write that fails for
        want of the database is retried, since the event may be the only copy of the result.
        The event goes to ``deliver_to`` (default: this runtime's queue) only when the row
        still waits for delivery; a row dropped while its work ran keeps the result only.
        ``on_recorded`` runs once the terminal row is committed (or was already terminal).
        """
        target = self.queue if deliver_to is None else deliver_to
        if attempt == 0:
            with self._lock:
                self._recording += 1
        try:
            fut = self.ledger.submit_finish(
                row_id, expected="running", state=event["status"], event=event
            )
        except BaseException:
            self._recorded()
            raise

        def committed(done: WriteFuture[bool]) -> None:
            exc = done.exception()
            if exc is None:
                try:
                    if done.result():
                        target.put(event)
                    if on_recorded is not None:
                        try:
                            on_recorded()
                        except Exception:
                            log.exception("after recording %s", row_id)
                finally:
                    self._recorded()
                return
            if isinstance(exc, LedgerUnavailable) and attempt < len(_FINALIZE_RETRY_SECONDS):
                delay = _FINALIZE_RETRY_SECONDS[attempt]
                log.warning("ledger unavailable finishing %s, retry in %ss: %s", row_id, delay, exc)
                timer = threading.Timer(
                    delay,
                    self.record_completion,
                    args=(row_id, event),
                    kwargs={
                        "deliver_to": target,
                        "attempt": attempt + 1,
                        "on_recorded": on_recorded,
                    },
                )
                timer.daemon = True
                timer.start()
            else:
                self._recorded()
                log.critical("could not record the completion of %s: %s", row_id, exc)

        fut.add_done_callback(committed)

    def _recorded(self) -> None:
        with self._lock:
            self._recording -= 1

    # -- control ----------------------------------------------------------------------------

    def interrupt(self, delegation_id: str, *, cancel: bool = False) -> bool:
        with self._lock:
            unit = self._slots.running.get(delegation_id)
            waiting = None if unit else self._remove_waiting(delegation_id)
        if waiting is not None:
            event = completion_event(
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

    @staticmethod
    def _stop_unit(unit: Unit) -> None:
        """Its row was cancelled: stop the runner (abort its model call, kill its command);
        whatever it returns finds the row terminal and is never delivered."""
        unit.cancel_requested = True
        if unit.interrupt_fn is not None:
            unit.interrupt_fn()

    # -- cancel from any surface, any server (``delivery.cancel``) ----------------------------

    def cancel(self, row_id: str, *, by: str, deliver_here: bool = True) -> CancelOutcome:
        """Settle the row ``cancelled`` (one compare-and-set) and stop its work: here when it
        runs here, else its owner is poked and stops it. ``deliver_here``: put the notice on
        this process's queue (a server); otherwise any server sharing the store offers it."""
        with self._lock:
            self._remove_waiting(row_id)  # a unit waiting here never starts
        outcome = self.ledger.cancel(row_id, by=by, deliver_here=deliver_here)
        if outcome.status != CANCELLED:
            return outcome
        log.info("background %s cancelled by %s", row_id, by)
        if outcome.event is not None and deliver_here:
            self.queue.put(outcome.event)
        if not self.watched.stop_here(row_id):
            self.watched.stop_orphan(row_id, outcome.kind, outcome.owner)
            self.ledger.notify_others()  # its owner (or a server to deliver the notice) looks
        return outcome

    def cancel_started_by(self, response_id: str, *, by: str) -> list[CancelOutcome]:
        """Cancel every unit the background Response ``response_id`` started (recorded on
        its row at dispatch); what each cancel did."""
        rows = [
            row
            for state in (State.RUNNING, State.QUEUED)
            for row in self.ledger.query(RowQuery(state=state.value, limit=10_000))
            if (row.request or {}).get(RESPONSE_KEY) == response_id
        ]
        return [self.cancel(row.id, by=by) for row in rows]

    # -- the work running here (``tools.watched_work``) ----------------------------------------

    def set_orphan_stopper(self, kind: str, stop: Callable[[str], object] | None) -> None:
        self.watched.set_orphan_stopper(kind, stop)

    def watch(self, row_id: str, stop: Callable[[], object]) -> None:
        self.watched.watch(row_id, stop)

    def unwatch(self, row_id: str) -> None:
        self.watched.unwatch(row_id)

    def honour_cancels(self) -> list[str]:
        return self.watched.honour_cancels()

    def progress(self, row_id: str, *, step: str | None = None, line: str | None = None) -> None:
        self.watched.progress(row_id, step=step, line=line)

    def outlives_server(self, row_id: str) -> None:
        """The work of ``row_id`` goes on without this server (an MCP task the MCP server
        keeps): a drain stops following it without waiting and leaves its row running, for
        the adopter of the server that takes it over (``Ledger.set_adopter``)."""
        with self._lock:
            self._outliving.add(row_id)

    def running_count(self) -> int:
        with self._lock:
            return len(self._slots.running)

    def waiting_count(self) -> int:
        with self._lock:
            return len(self._slots.waiting)

    # -- background re-offers -------------------------------------------------------------

    def start_scheduler(
        self, label: str = "", *, before_pass: Callable[[], object] | None = None
    ) -> ReofferScheduler:
        """Start re-offering this store's due rows; ``label`` names this server to its
        peers (e.g. its listening address). ``before_pass`` runs at each pass before due
        rows are offered (the recurring schedules write their next occurrence there)."""
        if self.scheduler is None:

            def on_pass() -> None:
                self.honour_cancels()
                if before_pass is not None:
                    before_pass()

            self.scheduler = ReofferScheduler(
                self.ledger, self.queue.put, label=label, on_pass=on_pass
            )
            self.scheduler.start()
        return self.scheduler

    def drain(self, grace_seconds: float) -> tuple[int, list[str]]:
        """The server is stopping: take no new work and give the running units
        ``grace_seconds`` to finish (their results are recorded and queued as always).
        Those still running then end ``interrupted``, with a completion that says the server
        was restarting; units still waiting never started and are left to the restart (they
        end ``interrupted`` there, as work of a stopped server always does). Returns how many
        finished meanwhile and the ids interrupted."""
        self.draining = True
        with self._lock:
            running = set(self._slots.running)
        deadline = time.monotonic() + max(grace_seconds, 0.0)
        while time.monotonic() < deadline:
            with self._lock:
                # Finished work counts once its event is queued, not when its slot frees:
                # the terminal row is written (and the event queued) a commit later.
                if not set(self._slots.running) - self._outliving and not self._recording:
                    break
            time.sleep(0.05)
        with self._lock:
            left = dict(self._slots.running)
            outliving = set(self._outliving)
            self._slots.waiting.clear()
        interrupted = []
        for delegation_id, unit in left.items():
            unit.drained = True
            if unit.interrupt_fn is not None:
                try:
                    unit.interrupt_fn()
                except Exception:
                    log.exception("could not interrupt %s", delegation_id)
            if delegation_id in outliving:
                log.info("background %s goes on without this server; left running", delegation_id)
                continue
            event = {
                **unit.request,
                "status": "interrupted",
                "error": (
                    "the server was restarting and this work did not finish in the "
                    f"{grace_seconds:g} s it was given; dispatch it again to rerun it"
                ),
                "completed_at": time.time(),
            }
            try:
                if self.ledger.finish(
                    delegation_id, expected="running", state="interrupted", event=event
                ):
                    interrupted.append(delegation_id)
                    since = unit.request.get("dispatched_at")
                    started = since if isinstance(since, int | float) else time.time()
                    traces.record_background(
                        "delegation", delegation_id, unit.request, started, "interrupted"
                    )
            except LedgerError:
                log.exception("could not record %s as interrupted", delegation_id)
        finished = len(running) - len(left)
        return finished, interrupted

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
            self.scheduler = None
        self.ledger.close()


# -- the process's runtime -------------------------------------------------------------------


def report_progress(step: str | None = None, line: str | None = None) -> None:
    """What the unit running on this thread is doing (a model call, a tool's name) and its
    last output line; nothing when this thread runs no unit. Never raises."""
    found: tuple[DelegationRuntime, str] | None = getattr(_current, "unit", None)
    if found is None:
        return
    runtime, row_id = found
    try:
        runtime.progress(row_id, step=step, line=line)
    except Exception:
        log.debug("progress of %s not recorded", row_id, exc_info=True)


def current_unit() -> tuple[DelegationRuntime, str] | None:
    """The runtime and row id of the unit running on this thread (work that records more
    on its own row: an MCP task's id), or None."""
    found: tuple[DelegationRuntime, str] | None = getattr(_current, "unit", None)
    return found


RuntimeFactory = Callable[[], DelegationRuntime]

_runtime: DelegationRuntime | None = None
_factory: RuntimeFactory | None = None
_runtime_lock = threading.Lock()


def open_runtime(
    path: str | None = None,
    *,
    policy: DeliveryPolicy | None = None,
    completion_queue: EventQueue | None = None,
    max_queued: int = DEFAULT_MAX_QUEUED,
    clock: Clock = time.time,
    backend: LedgerStore | None = None,
) -> DelegationRuntime:
    """A runtime on the SQLite ledger at ``path`` (or on an opened ``backend``, e.g.
    PostgreSQL, which the runtime then owns), putting on the shared queue by default.

    A building block for runtime factories; it does not make the result the process's one.
    """
    if (path is None) == (backend is None):
        raise TypeError("open_runtime needs exactly one of path or backend=")
    if completion_queue is None:
        completion_queue = shared_completion_queue
    ledger = Ledger(
        backend if backend is not None else open_ledger_file(str(path)), policy, clock=clock
    )
    return DelegationRuntime(ledger, completion_queue, max_queued=max_queued)


def open_ledger_file(path: str) -> LedgerStore:
    """The ledger in the file at ``path``, opened by the storage opener that the
    ``reveille.storage`` entry point names: this floor never names a storage dialect."""
    found = entry_points(group="reveille.storage", name="ledger_file")
    if not found:
        raise RuntimeError(
            "no ledger storage is installed (entry point reveille.storage:ledger_file); "
            "install reveille, or configure the runtime with an opened backend="
        )
    opener: Callable[[str], LedgerStore] = next(iter(found)).load()
    return opener(path)


def default_state_dir() -> Path:
    """``$REVEILLE_HOME``, or ``~/.reveille``: the state directory of reveille.settings."""
    return Path(os.environ.get("REVEILLE_HOME") or Path.home() / ".reveille").expanduser()


def open_default_runtime() -> DelegationRuntime:
    """The runtime used when no factory was registered: the state directory's ledger file."""
    return open_runtime(str(default_state_dir() / LEDGER_FILE))


def register_runtime_factory(fn: RuntimeFactory | None) -> RuntimeFactory | None:
    """Say how ``get_runtime`` opens this process's runtime (the composition root calls it).

    Takes effect at the next opening (a runtime already open stays); ``None`` restores the
    default. Returns the factory registered before.
    """
    global _factory
    with _runtime_lock:
        previous, _factory = _factory, fn
    return previous


def get_runtime() -> DelegationRuntime:
    """This process's runtime, opened on first use by the registered factory or the default."""
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                _runtime = (_factory or open_default_runtime)()
    return _runtime


def runtime_is_open() -> bool:
    """Whether this process's runtime was opened (by ``get_runtime`` or ``configure_runtime``)."""
    return _runtime is not None


def configure_runtime(
    path: str | None = None,
    *,
    policy: DeliveryPolicy | None = None,
    completion_queue: EventQueue | None = None,
    max_queued: int = DEFAULT_MAX_QUEUED,
    clock: Clock = time.time,
    backend: LedgerStore | None = None,
) -> DelegationRuntime:
    """Open the runtime on an explicit ledger file, or on an opened ``backend`` (tests,
    benchmarks, embedding, the composition root with PostgreSQL)."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.close()
        _runtime = open_runtime(
            path,
            policy=policy,
            completion_queue=completion_queue,
            max_queued=max_queued,
            clock=clock,
            backend=backend,
        )
        return _runtime


def reset_runtime() -> None:
    """Close this process's runtime; the next ``get_runtime`` opens a new one."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.close()
        _runtime = None
