"""The work running in this process that a cancel must be able to stop, and its progress.

Each unit or background command registers how to stop it (``watch``); a cancel made here
stops it at once (``stop_here``), one made elsewhere at the re-offer scheduler's next pass
(``honour_cancels``) or at its next progress write, which finds its row cancelled. Work of a
kind that outlives a dead owner (a command still running) has an orphan stopper. Progress
(what a unit is doing, its last output line) is written to the store at most once per
``PROGRESS_INTERVAL_SECONDS``, all units in one write. ``tools.delegation_runtime`` owns one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from delivery.cancel import Progress, is_active
from delivery.errors import LedgerError
from delivery.ledger import Ledger

__all__ = ["PROGRESS_INTERVAL_SECONDS", "WatchedWork"]

log = logging.getLogger("tools.delegation_runtime")

PROGRESS_INTERVAL_SECONDS = 1.0
"""At most one progress write per this many seconds (all units of a process in one write)."""


class WatchedWork:
    """Stoppers and progress of the work running here (see the module docstring)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._lock = threading.Lock()
        # How to stop the work of each row running in this process (units, processes), and
        # the work of a kind that outlives a dead owner (a command still running).
        self._stoppers: dict[str, Callable[[], object]] = {}
        self._orphan_stoppers: dict[str, Callable[[str], object]] = {}
        self._progress: dict[str, Progress] = {}
        self._dirty: set[str] = set()
        self._flush_timer: threading.Timer | None = None
        self._last_flush = 0.0

    def stop_orphan(self, row_id: str, kind: str | None, owner: str | None) -> None:
        """A cancelled row that runs nowhere here: stop it if its kind outlives a dead owner
        and its owner is dead (nobody else will)."""
        orphan = self._orphan_stoppers.get(kind or "")
        if orphan is not None and self.ledger.is_dead(owner):
            try:
                orphan(row_id)
            except Exception:
                log.exception("could not stop the orphaned work of %s", row_id)

    def set_orphan_stopper(self, kind: str, stop: Callable[[str], object] | None) -> None:
        """How to stop work of ``kind`` whose owner process died but which may still run
        (a background command): called with the row id when such a row is cancelled."""
        if stop is None:
            self._orphan_stoppers.pop(kind, None)
        else:
            self._orphan_stoppers[kind] = stop

    def watch(self, row_id: str, stop: Callable[[], object]) -> None:
        """``row_id`` runs in this process; ``stop`` stops it once its row is cancelled."""
        with self._lock:
            self._stoppers[row_id] = stop

    def unwatch(self, row_id: str) -> None:
        with self._lock:
            self._stoppers.pop(row_id, None)
            self._progress.pop(row_id, None)
            self._dirty.discard(row_id)

    def stop_here(self, row_id: str) -> bool:
        with self._lock:
            stop = self._stoppers.pop(row_id, None)
        if stop is None:
            return False
        try:
            stop()
        except Exception:
            log.exception("could not stop %s", row_id)
        return True

    def honour_cancels(self) -> list[str]:
        """Stop the work here whose rows were cancelled elsewhere; the ids stopped. The
        re-offer scheduler calls it at each pass (a cancel pokes every server)."""
        with self._lock:
            watched = list(self._stoppers)
        stopped: list[str] = []
        for row_id in watched:
            try:
                row = self.ledger.get(row_id)
            except LedgerError:
                return stopped
            if (row is None or not is_active(row.state)) and self.stop_here(row_id):
                stopped.append(row_id)
        return stopped

    def progress(self, row_id: str, *, step: str | None = None, line: str | None = None) -> None:
        """Record what ``row_id`` is doing; written to the store at most once per
        ``PROGRESS_INTERVAL_SECONDS`` (never blocks the caller)."""
        now = time.time()
        report = Progress.of(step, line, now)
        with self._lock:
            before = self._progress.get(row_id)
            self._progress[row_id] = before.merged(report) if before else report
            self._dirty.add(row_id)
            if self._flush_timer is not None:
                return
            delay = max(self._last_flush + PROGRESS_INTERVAL_SECONDS - now, 0.0)
            timer = self._flush_timer = threading.Timer(delay, self._flush_progress)
        timer.daemon = True
        timer.start()

    def _flush_progress(self) -> None:
        with self._lock:
            reports = {i: self._progress[i] for i in self._dirty if i in self._progress}
            self._dirty.clear()
            self._flush_timer = None
            self._last_flush = time.time()
        if not reports:
            return
        try:
            stale = self.ledger.submit_progress(reports).result()
        except (LedgerError, OSError) as exc:
            log.debug("progress not written: %s", exc)
            return
        for row_id in stale:  # cancelled elsewhere, and its poke not seen yet
            self.stop_here(row_id)
