"""The storage interfaces of the ledger; ``storage.sqlite``, ``storage.postgres`` and
``storage.memory`` implement both.

- ``LedgerBackend``: the work the rules need. The ledger's rules (claims, budgets, restore)
  live once, in ``delivery.ledger``, written against ``LedgerTx``: a handful of primitives
  that any transactional store can provide. A backend runs each operation atomically and
  may commit several operations together (group commit); callers never see which. Its
  reads are the scans recovery and re-offers make.
- ``LedgerViews``: what operators, metrics and pages read (queries, the audit log, counts,
  writer counters), never a write: a page cannot change the ledger through it.

Rows leave a backend as ``LedgerRow`` records, decoded once where they were read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from delivery.notifier import Notifier
from delivery.peers import ServerRecord
from delivery.rows import (
    FIELDS,
    AuditEntry,
    LedgerRow,
    PendingCounts,
    PrunedRow,
    RowQuery,
    SettledRow,
)
from delivery.write_future import WriteFuture

T = TypeVar("T")

# Columns of a ledger row, in storage order: the fields of ``LedgerRow``. JSON columns hold
# dicts.
COLUMNS: tuple[str, ...] = FIELDS
JSON_COLUMNS = frozenset({"request", "event", "progress"})


# One compare-and-set of ``LedgerTx.update_many``: the row, what it must still hold, the changes.
Update = tuple[str, dict[str, Any], dict[str, Any]]


class LedgerTx(Protocol):
    """One atomic operation's view of the store."""

    def get(self, row_id: str, columns: tuple[str, ...] | None = None) -> dict[str, Any] | None:
        """The row, or only ``columns`` of it (the hot paths need a few, not the event), as
        a dict: it never leaves the operation, and a partial row is no ``LedgerRow``."""

    def insert(self, row: dict[str, Any]) -> None:
        """Insert a new row; raises DuplicateDeliveryError when the id exists."""

    def update(self, row_id: str, expect: dict[str, Any], changes: dict[str, Any]) -> bool:
        """Compare-and-set: apply ``changes`` only where every ``expect`` column still matches.

        An ``expect`` value is an equality (None: IS NULL) or ``AtMost``/``Below``/``IsSet``;
        a ``changes`` value may be ``Increment``.
        """

    def update_many(self, updates: list[Update]) -> list[bool]:
        """``update`` of each ``(row_id, expect, changes)`` in order, in this transaction: what
        each answered. A store over a network sends them together (PostgreSQL: one pipeline,
        one round trip), so a pass over hundreds of rows does not wait for each."""

    def adopt_waiting(self, holder: str, identity: str, now: float, limit: int) -> int:
        """At most ``limit`` pending rows held by ``holder`` whose result is in and whose
        next attempt comes after ``now`` (a timer not yet due, a release's retry): held by
        ``identity`` from here (``updated_at``: ``now``), by one statement; how many. Rows
        another transaction is working on are skipped. What a survivor does with a dead
        holder's waiting rows (``delivery.recovery.reoffer_op`` adopts the same rows one by
        one, among those it reads)."""

    def lock_free(self, row_ids: list[str]) -> set[str]:
        """Of ``row_ids``, those no other transaction is working on now, locked for this one
        (PostgreSQL: ``FOR UPDATE SKIP LOCKED``; a store with one writer: all of them). A
        scan that picks rows skips the others instead of queueing behind their writers."""

    def audit(self, row_id: str, action: str, detail: str, at: float) -> None: ...

    def put_server(self, record: ServerRecord) -> None:
        """Record (or renew) a server sharing this store."""

    def delete_server(self, identity: str) -> bool:
        """Forget a server; False when it was not recorded."""


@runtime_checkable
class LedgerBackend(Protocol):
    """A store of ledger rows, as the rules use it. It describes itself by ``url`` and owns
    its wake-ups.

    ``durable`` (writes): True means the operation's commit must survive a power loss
    before its future resolves (the row before the work starts, the terminal row with its
    result). False is for writes whose loss can only cause a redelivery that the sinks
    absorb (a claim, an acknowledgement): the backend may resolve them once committed in
    its log, before the log reaches the disk. They still never survive a process crash
    less than a durable write would, and the next durable commit makes them durable too.
    """

    @property
    def url(self) -> str:
        """Where the store is, e.g. ``sqlite:///abs/path/ledger.db`` or ``memory://...``."""

    @property
    def notifier(self) -> Notifier:
        """Pokes every process sharing this store (the re-offer schedulers subscribe)."""

    def write(self, op: Callable[[LedgerTx], T], *, durable: bool = True, apart: bool = False) -> T:
        """Run ``op`` atomically; returns once it is committed.

        ``apart``: ``op`` picks its rows with ``lock_free`` and changes each by a
        compare-and-set, so it is as safe beside this process's other writes as beside
        another server's: a store with several connections may commit it in a transaction
        of its own instead of queued among them (a re-offer pass over a burst of due
        timers, which would otherwise wait for the consumers' claims of the last one)."""

    def submit(self, op: Callable[[LedgerTx], T], *, durable: bool = True) -> WriteFuture[T]:
        """Queue ``op`` for the next commit without waiting (coroutines: ``submit_async``)."""

    def submit_async(
        self, op: Callable[[LedgerTx], T], *, durable: bool = True
    ) -> asyncio.Future[T]:
        """Queue ``op`` and return a future of the running event loop."""

    def get(self, row_id: str) -> LedgerRow | None: ...

    def pending_with_event(self, limit: int) -> list[LedgerRow]:
        """Pending rows that carry an event, oldest completion first."""

    def due(self, now: float, limit: int) -> list[LedgerRow]:
        """Pending rows whose ``due_at`` has come, earliest first."""

    def next_due_at(self) -> float | None: ...

    def pending_holders(self) -> list[str]:
        """Distinct holders of pending rows (who is responsible for offering them)."""

    def active_owners(self, state: str) -> list[str]:
        """Distinct owners of rows in one active lifecycle state."""

    def rows_held_by(self, holder: str, limit: int) -> list[LedgerRow]: ...

    def rows_owned_by(self, owner: str, state: str, limit: int) -> list[LedgerRow]:
        """Up to ``limit`` rows of ``owner`` in one active lifecycle state."""

    def servers(self) -> list[ServerRecord]:
        """Every server recorded as sharing this store, earliest start first (the roster
        decides from them which holders are dead)."""

    def close(self) -> None: ...


@runtime_checkable
class LedgerViews(Protocol):
    """The ledger as operators, metrics and pages read it: no writes, no claims."""

    def query(self, query: RowQuery) -> list[LedgerRow]:
        """Rows matching ``query`` (see ``RowQuery``)."""

    def audit_log(self, row_id: str) -> list[AuditEntry]:
        """The row's audit entries (``at``, ``action``, ``detail``), oldest first."""

    def servers(self) -> list[ServerRecord]:
        """Every server recorded as sharing this store, earliest start first."""

    def stats(self) -> dict[str, int]:
        """Counters: commits (each one fsync of the log at synchronous=FULL), operations."""

    def delivery_counts(self) -> dict[str, int]:
        """Rows waiting for delivery (``pending``), and those of them under a claim now
        (``claimed``: a claim token is set; a lapsed claim counts until the row is claimed
        again or settled). The ``reveille_delivery_rows`` metric."""

    def pending_counts(self, now: float) -> PendingCounts:
        """Rows waiting for delivery by lifecycle state, and how many of them are not due
        before ``now`` (``PendingCounts``). The ``reveille_ledger_pending_rows`` metrics."""


@runtime_checkable
class LedgerRetention(Protocol):
    """What retention (``delivery.retention``) does to a ledger: prune settled rows in
    batches, leaving a tombstone for each, expire the tombstones, and hold the lease that
    lets one server at a time run it. Nothing here touches a pending row, unfinished work
    or a live claim: every delete re-checks that in its own ``WHERE``."""

    def settled_before(
        self, before: float, after: SettledRow | None, limit: int
    ) -> list[SettledRow]:
        """Rows whose work ended and whose delivery settled (delivered or dropped) before
        ``before``, with no live claim, in (``settled_at``, ``id``) order after ``after``:
        the candidates of one batch (a keyset page, so kept rows are never read twice)."""

    def prune_settled(self, ids: list[str], before: float, pruned_at: float, reason: str) -> int:
        """Delete those of ``ids`` that are still settled before ``before``, with their audit
        entries, and record a tombstone for each, in one transaction; how many went."""

    def pruned(self, row_id: str) -> PrunedRow | None:
        """The tombstone of a pruned row, or None."""

    def prune_tombstones(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        """Forget at most ``limit`` tombstones recorded before ``before`` (with ``dry_run``
        only count them); how many."""

    def take_lease(self, name: str, holder: str, now: float, ttl_seconds: float) -> bool:
        """Take (or renew) the lease ``name`` until ``now + ttl_seconds`` when it is free,
        lapsed or already ``holder``'s; False while another holder's lease lives."""


@runtime_checkable
class LedgerStore(LedgerBackend, LedgerViews, LedgerRetention, Protocol):
    """A backend as the opener hands it out: the rules' work and the operators' views."""


@dataclass(frozen=True, slots=True)
class AtMost:
    """In ``expect``: the column is ``<= value`` (e.g. a lease that has run out)."""

    value: Any


@dataclass(frozen=True, slots=True)
class Below:
    """In ``expect``: the column is ``< value`` (e.g. attempts under the budget)."""

    value: Any


@dataclass(frozen=True, slots=True)
class IsSet:
    """In ``expect``: the column is not NULL."""


@dataclass(frozen=True, slots=True)
class Increment:
    """In ``changes``: add ``by`` to the column, in the same statement."""

    by: int = 1


def check_columns(changes: Iterable[str]) -> None:
    unknown = set(changes) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown ledger column(s): {', '.join(sorted(unknown))}")
