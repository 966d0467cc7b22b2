"""Retention: what is pruned, after how long, and what never is.

Each kind of stored thing that grows without bound is one ``RetentionKind`` entry of
``KINDS``: its name, the ``RetentionPolicy`` field that says after how many days it goes
(0 keeps it forever), and its pruner, a small function over one backend method. Stored
responses go after ``[responses] keep_days`` (the one setting for them, read into
``RetentionPolicy.response_days``), so that one scheduler prunes them, not the responses
service as well.

What is never pruned, whatever the settings say (each backend's delete re-checks it in its
own ``WHERE``, so a row that changed since it was picked is left alone):

- a pending ledger row (a result not delivered yet, to any surface), queued or running
  work, a row under a claim that could still be live;
- a settled row whose result lives on as a delivery row of an API session's transcript
  that no turn has folded yet (its conversation has still to see it);
- a running idempotency record (a live claim), an event or a process directory of work
  that has not ended;
- a transcript row compaction has not archived (the live summary included), and an
  archived delivery row no turn has folded (compaction never archives one: checked again);
- a queued or running response, and a finished one whose terminal hook (its webhook) has
  not run yet.

A pruned ledger row leaves a tombstone (``delivery.rows.PrunedRow``) that says when and why,
so ``get_durable_delegation``, ``reveille deliveries show`` and the web UI answer "pruned
on <date>" instead of "no such row"; tombstones expire after ``tombstone_days``.

``run_retention`` prunes once (``reveille prune``; ``dry_run`` only counts), then hands the
freed pages back to the file system (``RetentionStores.reclaim``: SQLite's incremental
vacuum). ``RetentionScheduler`` runs it in a server every ``interval_seconds``, on a worker
thread, and only while it holds the store's ``retention`` lease, so of several servers
sharing a store one prunes per interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from delivery.backend import LedgerStore
from delivery.events import transcript_key
from delivery.inbound_backend import HookBackend
from delivery.responses_backend import ResponsesBackend
from delivery.rows import SettledRow
from delivery.session_backend import SessionUpkeep
from delivery.states import ACTIVE_STATES
from delivery.webui_state import WebUIStateBackend

__all__ = [
    "KINDS",
    "KindResult",
    "PruneReport",
    "PruneRun",
    "RetentionKind",
    "RetentionPolicy",
    "RetentionScheduler",
    "RetentionStores",
    "SpaceReport",
    "run_retention",
]

log = logging.getLogger(__name__)

DAY = 86400.0
LEASE = "retention"
# Dry runs count in one go; a count is a read, and no write waits behind it.
_COUNT_ALL = 1 << 40


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Days each kind is kept after it settled (0: forever), how often a server prunes,
    and how many rows one transaction deletes."""

    settled_days: float = 30.0
    archived_transcript_days: float = 30.0
    idempotency_days: float = 7.0
    tombstone_days: float = 90.0
    webui_event_days: float = 7.0
    process_output_days: float = 7.0
    response_days: float = 30.0
    hook_event_days: float = 30.0
    interval_seconds: float = 3600.0
    batch: int = 2000

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"{f.name} must not be negative")
        if self.interval_seconds <= 0 or self.batch < 1:
            raise ValueError("interval_seconds and batch must be positive")


@dataclass(frozen=True, slots=True)
class SpaceReport:
    """What reclaiming space did to one SQLite file: its size before and after (bytes, its
    log included), whether it was converted to incremental vacuum, or still needs to be."""

    path: str
    bytes_before: int
    bytes_after: int
    converted: bool
    needs_conversion: bool


@dataclass(frozen=True)
class RetentionStores:
    """What retention works on. ``reclaim(convert)`` frees deleted pages (SQLite; the
    composition root passes the opener's), converting older files when ``convert``."""

    ledger: LedgerStore
    sessions: SessionUpkeep | None = None
    webui: WebUIStateBackend | None = None
    processes_dir: Path | None = None
    reclaim: Callable[[bool], list[SpaceReport]] | None = None
    responses: ResponsesBackend | None = None
    hooks: HookBackend | None = None


@dataclass(frozen=True, slots=True)
class PruneRun:
    """What one kind's pruner is handed: prune what settled ``before`` (``now`` less the
    kind's days), ``batch`` rows per transaction, or only count with ``dry_run``."""

    stores: RetentionStores
    now: float
    days: float
    before: float
    batch: int
    dry_run: bool
    stop: threading.Event | None = None
    """Set when the server is stopping: a pruner ends after the batch it is in."""

    @property
    def stopping(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    @property
    def reason(self) -> str:
        return f"retention: settled more than {self.days:g} days before"


@dataclass(frozen=True, slots=True)
class RetentionKind:
    """One kind of stored thing retention prunes (an entry of ``KINDS``)."""

    name: str
    setting: str
    """The ``RetentionPolicy`` field with its days (its ``[retention]`` key, except
    ``response_days``: ``[responses] keep_days``)."""
    what: str
    prune: Callable[[PruneRun], int]


@dataclass(frozen=True, slots=True)
class KindResult:
    """One kind's outcome: removed (or, dry, would remove) ``count`` in ``seconds``."""

    kind: str
    days: float
    count: int
    seconds: float
    note: str = ""

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0

    def describe(self, dry_run: bool) -> str:
        if self.note:
            return f"{self.kind}: {self.note}"
        verb = "would remove" if dry_run else "removed"
        return (
            f"{self.kind}: {verb} {self.count} (older than {self.days:g} days) in "
            f"{self.seconds:.2f} s, {self.rate:,.0f}/s"
        )


@dataclass(frozen=True, slots=True)
class PruneReport:
    dry_run: bool
    kinds: tuple[KindResult, ...]
    space: tuple[SpaceReport, ...] = field(default=())

    @property
    def total(self) -> int:
        return sum(k.count for k in self.kinds)


# --------------------------------------------------------------------------- the pruners


def _batched(run: PruneRun, step: Callable[[int, bool], int]) -> int:
    """Call ``step(limit, dry_run)`` until a batch comes back short; a dry run counts once."""
    if run.dry_run:
        return step(_COUNT_ALL, True)
    total = 0
    while True:
        n = step(run.batch, False)
        total += n
        if n < run.batch or run.stopping:
            return total


def prune_settled_rows(run: PruneRun) -> int:
    """Settled ledger rows, keeping those whose result an API session has not folded yet."""
    ledger, sessions = run.stores.ledger, run.stores.sessions
    total = 0
    after: SettledRow | None = None
    while True:
        page = ledger.settled_before(run.before, after, run.batch)
        if not page:
            return total
        owed: set[tuple[str, str]] = set()
        in_transcripts = [
            (r.origin_session_id, transcript_key(r.id)) for r in page if r.origin_session_id
        ]
        if in_transcripts and sessions is not None:
            owed = sessions.unfolded_deliveries(in_transcripts)
        ids = [
            r.id
            for r in page
            if not r.origin_session_id or (r.origin_session_id, transcript_key(r.id)) not in owed
        ]
        if run.dry_run:
            total += len(ids)
        else:
            total += ledger.prune_settled(ids, run.before, run.now, run.reason)
        if len(page) < run.batch or run.stopping:
            return total
        after = page[-1]


def prune_archived_transcript_rows(run: PruneRun) -> int:
    """Transcript rows a compaction archived before ``before``: the model no longer reads
    them (their summary does), the transcript API no longer lists them."""
    sessions = run.stores.sessions
    if sessions is None:
        return 0
    return _batched(
        run, lambda n, dry: sessions.prune_archived_messages(run.before, n, dry_run=dry)
    )


def prune_idempotency(run: PruneRun) -> int:
    sessions = run.stores.sessions
    if sessions is None:
        return 0
    return _batched(run, lambda n, dry: sessions.prune_idempotency(run.before, n, dry_run=dry))


def prune_tombstones(run: PruneRun) -> int:
    """Both kinds of tombstone: of pruned ledger rows, and of deleted sessions (a late write
    of a turn that began before a delete is long over by then)."""
    ledger, sessions = run.stores.ledger, run.stores.sessions
    total = _batched(run, lambda n, dry: ledger.prune_tombstones(run.before, n, dry_run=dry))
    if sessions is not None:
        total += _batched(run, lambda n, dry: sessions.prune_tombstones(run.before, n, dry_run=dry))
    return total


def prune_webui_events(run: PruneRun) -> int:
    webui = run.stores.webui
    if webui is None:
        return 0
    return _batched(run, lambda n, dry: webui.prune_events_before(run.before, n, dry_run=dry))


def prune_hook_events(run: PruneRun) -> int:
    hooks = run.stores.hooks
    if hooks is None:
        return 0
    return _batched(run, lambda n, dry: hooks.prune_events(run.before, n, dry_run=dry))


def _last_touched(directory: Path) -> float:
    newest = directory.stat().st_mtime
    for child in directory.iterdir():
        with contextlib.suppress(OSError):
            newest = max(newest, child.stat().st_mtime)
    return newest


def prune_process_outputs(run: PruneRun) -> int:
    """Directories of background processes (``<home>/processes/<id>/``) untouched for the
    kind's days whose work the ledger knows has ended (a terminal row, or its tombstone).
    Normally the directory goes as soon as the result is recorded; these are the ones a
    crash left behind. A directory the ledger knows nothing of is left alone."""
    root, ledger = run.stores.processes_dir, run.stores.ledger
    if root is None or not root.is_dir():
        return 0
    count = 0
    for directory in sorted(root.iterdir()):
        try:
            if not directory.is_dir() or _last_touched(directory) >= run.before:
                continue
        except OSError:
            continue
        row = ledger.get(directory.name)
        ended = row.state not in ACTIVE_STATES if row is not None else False
        if not ended and (row is not None or ledger.pruned(directory.name) is None):
            continue
        count += 1
        if not run.dry_run:
            shutil.rmtree(directory, ignore_errors=True)
    return count


def prune_stored_responses(run: PruneRun) -> int:
    """Responses of the Responses API that ended before ``before``, with their events."""
    responses = run.stores.responses
    if responses is None:
        return 0
    return _batched(run, lambda n, dry: responses.prune(run.before, n, dry_run=dry))


KINDS: tuple[RetentionKind, ...] = (
    RetentionKind(
        "settled_ledger_rows",
        "settled_days",
        "ledger rows whose work ended and whose delivery settled (delivered or dropped)",
        prune_settled_rows,
    ),
    RetentionKind(
        "archived_transcript_rows",
        "archived_transcript_days",
        "transcript rows compaction archived (archived_at); never an unfolded delivery row",
        prune_archived_transcript_rows,
    ),
    RetentionKind(
        "idempotency_records",
        "idempotency_days",
        "finished Idempotency-Key records of the API (running ones are live claims)",
        prune_idempotency,
    ),
    RetentionKind(
        "tombstones",
        "tombstone_days",
        "tombstones of pruned ledger rows and of deleted sessions",
        prune_tombstones,
    ),
    RetentionKind(
        "webui_events",
        "webui_event_days",
        "events of the web UI's shared event log",
        prune_webui_events,
    ),
    RetentionKind(
        "process_outputs",
        "process_output_days",
        "directories of ended background processes left under REVEILLE_HOME/processes",
        prune_process_outputs,
    ),
    RetentionKind(
        "stored_responses",
        "response_days",
        "stored API responses and their stream events, by when they ended (completed_at)",
        prune_stored_responses,
    ),
    RetentionKind(
        "hook_events",
        "hook_event_days",
        "inbound events (POST /v1/hooks/NAME) by when they came; a re-post after this is new",
        prune_hook_events,
    ),
)


def run_retention(
    stores: RetentionStores,
    policy: RetentionPolicy,
    *,
    now: float | None = None,
    dry_run: bool = False,
    convert: bool = False,
    clock: Callable[[], float] = time.perf_counter,
    stop: threading.Event | None = None,
) -> PruneReport:
    """Prune every kind once (see the module docstring); then, unless ``dry_run``, give the
    freed space back (``convert``: switch older SQLite files to incremental vacuum)."""
    now = time.time() if now is None else now
    results: list[KindResult] = []
    for kind in KINDS:
        days = float(getattr(policy, kind.setting))
        if days <= 0:
            results.append(KindResult(kind.name, days, 0, 0.0, "kept forever (0 days)"))
            continue
        if stop is not None and stop.is_set():
            results.append(KindResult(kind.name, days, 0, 0.0, "not reached: stopping"))
            continue
        run = PruneRun(stores, now, days, now - days * DAY, policy.batch, dry_run, stop)
        started = clock()
        count = kind.prune(run)
        results.append(KindResult(kind.name, days, count, clock() - started))
    space: list[SpaceReport] = []
    if not dry_run and stores.reclaim is not None:
        space = stores.reclaim(convert)
    return PruneReport(dry_run, tuple(results), tuple(space))


class RetentionScheduler:
    """Prunes every ``interval_seconds`` in a server, off the event loop, while holding the
    store's ``retention`` lease (taken for one interval and not given back: the next
    server to take it is the one whose turn it is one interval later). Should a run outlast
    its lease, another server may prune beside it; every delete re-checks what it may
    delete, so that costs time, never data."""

    def __init__(
        self,
        stores: RetentionStores,
        policy: RetentionPolicy,
        *,
        holder: str,
        first_delay_seconds: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.stores = stores
        self.policy = policy
        self.holder = holder
        self.first_delay_seconds = first_delay_seconds
        self.clock = clock
        self.runs = 0
        self.last: PruneReport | None = None
        self._task: asyncio.Task[None] | None = None
        # A run is on a worker thread, which a cancelled task does not stop: ``aclose`` asks
        # it to end after its batch and waits for that, before the stores close under it.
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._idle.set()

    def run_once(self) -> PruneReport | None:
        """Prune now if this server takes the lease; None when another holds it."""
        self._idle.clear()
        try:
            return self._run_once()
        finally:
            self._idle.set()

    def _run_once(self) -> PruneReport | None:
        now = self.clock()
        lease = self.policy.interval_seconds
        if self._stop.is_set() or not self.stores.ledger.take_lease(LEASE, self.holder, now, lease):
            return None
        report = run_retention(self.stores, self.policy, now=now, stop=self._stop)
        self.runs += 1
        self.last = report
        pruned = ", ".join(f"{k.kind}={k.count}" for k in report.kinds if not k.note)
        freed = sum(s.bytes_before - s.bytes_after for s in report.space)
        log.info("retention: pruned %s; %d bytes freed", pruned, max(freed, 0))
        return report

    async def _loop(self) -> None:
        await asyncio.sleep(self.first_delay_seconds)
        while True:
            try:
                await asyncio.to_thread(self.run_once)
            except Exception:
                # A store that is briefly unavailable must not end retention for good.
                log.exception("retention: pruning failed; trying again next interval")
            await asyncio.sleep(self.policy.interval_seconds)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="retention")

    async def aclose(self, wait_seconds: float = 30.0) -> None:
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.to_thread(self._idle.wait, wait_seconds)
