"""The bookkeeping a group-commit writer shares with every other one, whatever its SQL:
the queue of waiting operations that writer threads take batches from, which operations of
a batch are still wanted and whether it must be durable, and the counts of what was
committed (``stats``). SQLite's ``storage.sqlite.writer`` and PostgreSQL's
``storage.postgres.ledger`` each add only their transaction: how a batch is begun, run,
isolated and committed.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from storage.waiters import Outcome, Waiter, resolve, still_wanted

__all__ = ["Batch", "BatchQueue", "CommitCounts", "Item", "Live", "wanted"]

# An operation (a function of the writer's transaction), who waits for it, and whether it
# must be on disk when the waiter hears of it.
Item = tuple[Any, Waiter, bool]
Batch = list[Item]
Live = list[tuple[Any, Waiter]]


def wanted(batch: Batch) -> tuple[Live, bool]:
    """The operations of ``batch`` somebody still waits for (a coroutine's can be cancelled
    before it runs), and whether any of those must be durable."""
    live: Live = []
    durable = False
    for op, waiter, must in batch:  # one look at each waiter: a batch holds hundreds
        if still_wanted(waiter):
            live.append((op, waiter))
            durable = durable or must
    return live, durable


class BatchQueue:
    """Operations waiting for a writer, in the order they were submitted. ``cv`` guards it
    and the writers' own busy flags; ``stopping`` lets the writers finish what is queued
    and end."""

    def __init__(self, max_batch: int) -> None:
        # ``put`` holds the lock itself: a C lock's ``with``, where the condition's own
        # ``__enter__`` and ``__exit__`` are two Python calls for every write submitted.
        self._lock = threading.RLock()
        self.cv = threading.Condition(self._lock)
        self.pending: collections.deque[Item] = collections.deque()
        self.stopping = False
        self.max_batch = max_batch
        self._waiting = 0  # writer threads waiting in ``next_batch``

    def put(self, item: Item) -> None:
        with self._lock:
            self.pending.append(item)
            # Only a waiting writer needs waking. While every writer is committing (a burst:
            # most writes are queued then) the notify would be three Python calls for nobody.
            if self._waiting:
                self.cv.notify_all()

    def next_batch(self, busy: Callable[[], bool]) -> Batch | None:
        """Under ``cv``: wait until there is work and the writer is not ``busy``, then take
        up to ``max_batch`` operations; None once stopping with nothing left."""
        while busy() or (not self.pending and not self.stopping):
            self._waiting += 1
            try:
                self.cv.wait()
            finally:
                self._waiting -= 1
        if not self.pending:
            return None
        n = min(len(self.pending), self.max_batch)
        return [self.pending.popleft() for _ in range(n)]


class CommitCounts:
    """What a writer committed: transactions, those fsynced (durable), operations."""

    def __init__(self) -> None:
        self.commits = 0
        self.durable_commits = 0
        self.operations = 0

    def committed(self, live: Live, durable: bool, outcomes: list[Outcome]) -> None:
        """Count a committed batch and hand its outcomes to their waiters."""
        self.commits += 1
        self.durable_commits += durable
        self.operations += len(live)
        resolve(outcomes)

    @staticmethod
    def failed(live: Live, error: Exception) -> None:
        """Nothing of the batch was written: every waiter gets ``error``."""
        resolve([(waiter, False, error) for _, waiter in live])
