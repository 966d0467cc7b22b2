"""The storage interface the ledger logic runs on; ``storage.sqlite``, ``storage.postgres`` and
``storage.memory`` implement it.

The ledger's rules (claims, budgets, restore) live once, in ``delivery.ledger``, written
against ``LedgerTx``: a handful of primitives that any transactional store can provide.
A backend runs each operation atomically and may commit several operations together
(group commit); callers never see which.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from delivery.notifier import Notifier
from delivery.peers import ServerRecord
from delivery.write_future import WriteFuture

T = TypeVar("T")

# Columns of a ledger row, in storage order. JSON columns hold dicts.
COLUMNS: tuple[str, ...] = (
    "id",
    "kind",
    "state",
    "delivery_state",
    "session_key",
    "origin_session_id",
    "origin_ui_session_id",
    "goal",
    "request",
    "event",
    "owner",
    "holder",
    "created_at",
    "updated_at",
    "started_at",
    "completed_at",
    "claim_token",
    "claim_consumer",
    "claimed_at",
    "claim_expires_at",
    "delivery_attempts",
    "refunds",
    "next_attempt_at",
    "due_at",
    "settled_at",
    "settled_reason",
    "replay_from",
    "restored",
)
JSON_COLUMNS = frozenset({"request", "event"})


class LedgerTx(Protocol):
    """One atomic operation's view of the store."""

    def get(self, row_id: str, columns: tuple[str, ...] | None = None) -> dict[str, Any] | None:
        """The row, or only ``columns`` of it (the hot paths need a few, not the event)."""

    def insert(self, row: dict[str, Any]) -> None:
        """Insert a new row; raises DuplicateDeliveryError when the id exists."""

    def update(self, row_id: str, expect: dict[str, Any], changes: dict[str, Any]) -> bool:
        """Compare-and-set: apply ``changes`` only where every ``expect`` column still matches.

        An ``expect`` value is an equality (None: IS NULL) or ``AtMost``/``Below``/``IsSet``;
        a ``changes`` value may be ``Increment``.
        """

    def lock_free(self, row_ids: list[str]) -> set[str]:
        """Of ``row_ids``, those no other transaction is working on now, locked for this one
        (PostgreSQL: ``FOR UPDATE SKIP LOCKED``; a store with one writer: all of them). A
        scan that picks rows skips the others instead of queueing behind their writers."""

    def audit(self, row_id: str, action: str, detail: str, at: float) -> None: ...

    def put_server(self, record: ServerRecord) -> None:
        """Record (or renew) a server sharing this store."""

    def delete_server(self, identity: str) -> bool:
        """Forget a server; False when it was not recorded."""


class LedgerBackend(Protocol):
    """A store of ledger rows. It describes itself by ``url`` and owns its wake-ups.

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

    def write(self, op: Callable[[LedgerTx], T], *, durable: bool = True) -> T:
        """Run ``op`` atomically; returns once it is committed."""

    def submit(self, op: Callable[[LedgerTx], T], *, durable: bool = True) -> WriteFuture[T]:
        """Queue ``op`` for the next commit without waiting (coroutines: ``submit_async``)."""

    def submit_async(
        self, op: Callable[[LedgerTx], T], *, durable: bool = True
    ) -> asyncio.Future[T]:
        """Queue ``op`` and return a future of the running event loop."""

    def get(self, row_id: str) -> dict[str, Any] | None: ...

    def query(
        self,
        *,
        state: str | None = None,
        delivery_state: str | None = None,
        session: str | None = None,
        kind: str | None = None,
        limit: int = 100,
        oldest_first: bool = False,
    ) -> list[dict[str, Any]]: ...

    def pending_with_event(self, limit: int) -> list[dict[str, Any]]:
        """Pending rows that carry an event, oldest completion first."""

    def due(self, now: float, limit: int) -> list[dict[str, Any]]:
        """Pending rows whose ``due_at`` has come, earliest first."""

    def next_due_at(self) -> float | None: ...

    def pending_holders(self) -> list[str]:
        """Distinct holders of pending rows (who is responsible for offering them)."""

    def active_owners(self, state: str) -> list[str]:
        """Distinct owners of rows in one active lifecycle state."""

    def rows_held_by(self, holder: str, limit: int) -> list[dict[str, Any]]: ...

    def rows_owned_by(self, owner: str, state: str, limit: int) -> list[dict[str, Any]]: ...

    def audit_log(self, row_id: str) -> list[dict[str, Any]]: ...

    def servers(self) -> list[ServerRecord]:
        """Every server recorded as sharing this store, earliest start first."""

    def stats(self) -> dict[str, int]:
        """Counters: commits (each one fsync of the log at synchronous=FULL), operations."""

    def close(self) -> None: ...


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
