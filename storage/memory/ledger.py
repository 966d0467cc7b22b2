"""An in-memory ``LedgerBackend``: the same ``LedgerTx`` semantics as SQLite, nothing on disk.

For tests and for embedding where nothing must outlive the process. Every operation runs
under one lock, atomically: the changes of an operation that raises are undone (an undo
log of the rows it touched and of the audit entries it added), like a savepoint. JSON
columns are stored as their JSON round trip, so values come back exactly as SQLite returns
them (tuples as lists, unknown types as strings). Rows are copied in and out; callers never
share the store's dicts. ``durable`` is accepted and has no meaning here.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import json
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from delivery.backend import (
    COLUMNS,
    JSON_COLUMNS,
    AtMost,
    Below,
    Increment,
    IsSet,
    LedgerTx,
    Update,
    check_columns,
)
from delivery.errors import DuplicateDeliveryError, LedgerUnavailable
from delivery.peers import ServerRecord
from delivery.rows import AuditEntry, LedgerRow, PendingCounts, PrunedRow, RowQuery, SettledRow
from delivery.session_backend import holds_terms
from delivery.write_future import WriteFuture
from storage.pokes import LocalNotifier

T = TypeVar("T")

# What SQLite's schema gives a column an insert leaves out
_DEFAULTS: dict[str, int | None] = {
    **dict.fromkeys(COLUMNS),
    "claim_expires_at": 0,
    "delivery_attempts": 0,
    "refunds": 0,
    "next_attempt_at": 0,
    "restored": 0,
}
_NOT_NULL = ("id", "kind", "state", "delivery_state", "created_at", "updated_at")
_ids = itertools.count(1)


def _json(value: Any) -> Any:
    if value is None:
        return None
    return json.loads(json.dumps(value, separators=(",", ":"), default=str))


def _matches(value: Any, check: Any) -> bool:
    """One ``expect`` predicate, with SQL's NULL rules (NULL compares false)."""
    kind = type(check)
    if check is None:
        return value is None
    if kind is IsSet:
        return value is not None
    if value is None:
        return False
    if kind is AtMost:
        return bool(value <= check.value)
    if kind is Below:
        return bool(value < check.value)
    return bool(value == check)


class _MemoryTx:
    """The ``LedgerTx`` of one operation; records what to undo should the operation fail."""

    def __init__(self, store: MemoryBackend) -> None:
        self._store = store
        self._undo: dict[str, dict[str, Any] | None] = {}
        self._server_undo: dict[str, ServerRecord | None] = {}
        self._audit_len = len(store._audit)

    def _touch(self, row_id: str) -> None:
        if row_id not in self._undo:
            row = self._store._rows.get(row_id)
            self._undo[row_id] = None if row is None else dict(row)

    def rollback(self) -> None:
        rows = self._store._rows
        for row_id, before in self._undo.items():
            if before is None:
                rows.pop(row_id, None)
            else:
                rows[row_id] = before
        del self._store._audit[self._audit_len :]
        for identity, record in self._server_undo.items():
            if record is None:
                self._store._servers.pop(identity, None)
            else:
                self._store._servers[identity] = record

    def get(self, row_id: str, columns: tuple[str, ...] | None = None) -> dict[str, Any] | None:
        if columns is not None:
            check_columns(columns)
        row = self._store._rows.get(row_id)
        if row is None:
            return None
        return _copy_columns(row, columns or COLUMNS)

    def insert(self, row: dict[str, Any]) -> None:
        check_columns(row)
        missing = [c for c in _NOT_NULL if row.get(c) is None]
        if missing:
            raise ValueError(f"a ledger row needs {', '.join(missing)}")
        row_id = row["id"]
        if row_id in self._store._rows:
            raise DuplicateDeliveryError(f"a ledger row with id {row_id!r} exists")
        self._touch(row_id)
        stored = {**_DEFAULTS, **row, "_seq": next(_ids)}
        for col in JSON_COLUMNS:
            stored[col] = _json(stored[col])
        self._store._rows[row_id] = stored

    def update(self, row_id: str, expect: dict[str, Any], changes: dict[str, Any]) -> bool:
        check_columns(changes)
        check_columns(expect)
        row = self._store._rows.get(row_id)
        if row is None or not all(_matches(row[c], v) for c, v in expect.items()):
            return False
        self._touch(row_id)
        for col, value in changes.items():
            if type(value) is Increment:
                row[col] = row[col] + value.by
            elif col in JSON_COLUMNS:
                row[col] = _json(value)
            else:
                row[col] = value
        return True

    def update_many(self, updates: list[Update]) -> list[bool]:
        return [self.update(*one) for one in updates]

    def adopt_waiting(self, holder: str, identity: str, now: float, limit: int) -> int:
        adopted = 0
        for row_id, row in self._store._rows.items():
            if adopted >= limit:
                break
            if (
                row["delivery_state"] == "pending"
                and row["holder"] == holder
                and row["completed_at"] is not None
                and row["next_attempt_at"] > now
            ):
                self._touch(row_id)
                row["holder"], row["updated_at"] = identity, now
                adopted += 1
        return adopted

    def lock_free(self, row_ids: list[str]) -> set[str]:
        return set(row_ids)  # one lock for the whole store: nobody else is writing

    def audit(self, row_id: str, action: str, detail: str, at: float) -> None:
        self._store._audit.append((row_id, at, action, detail))

    def put_server(self, record: ServerRecord) -> None:
        servers = self._store._servers
        self._server_undo.setdefault(record.identity, servers.get(record.identity))
        before = servers.get(record.identity)
        started = before.started_at if before is not None else record.started_at
        servers[record.identity] = dataclasses.replace(record, started_at=started)

    def delete_server(self, identity: str) -> bool:
        servers = self._store._servers
        if identity not in servers:
            return False
        self._server_undo.setdefault(identity, servers[identity])
        del servers[identity]
        return True


def _copy_columns(row: dict[str, Any], columns: Iterable[str]) -> dict[str, Any]:
    out = {c: row[c] for c in columns}
    for col in JSON_COLUMNS.intersection(out):
        out[col] = copy.deepcopy(out[col])
    return out


def _copy_out(row: dict[str, Any]) -> LedgerRow:
    """A stored row as the record readers get; its JSON columns are copies, so no reader
    ever shares a dict with the store."""
    return LedgerRow(**_copy_columns(row, COLUMNS))


class MemoryBackend:
    """``LedgerBackend`` and ``LedgerViews`` in this process's memory; ``url`` is
    ``memory://<name>``."""

    def __init__(self, name: str = "ledger") -> None:
        self._name = name
        self._rows: dict[str, dict[str, Any]] = {}
        self._audit: list[tuple[str, float, str, str]] = []
        self._servers: dict[str, ServerRecord] = {}
        self._tombstones: dict[str, PrunedRow] = {}
        self._leases: dict[str, tuple[str, float]] = {}
        self._lock = threading.RLock()
        self._notifier = LocalNotifier()
        self._closed = False
        self._commits = 0

    @property
    def url(self) -> str:
        return f"memory://{self._name}"

    @property
    def notifier(self) -> LocalNotifier:
        return self._notifier

    # -- writes ---------------------------------------------------------------------------

    def _run(self, op: Callable[[LedgerTx], T]) -> T:
        with self._lock:
            if self._closed:
                raise LedgerUnavailable(f"the ledger {self.url} is closed")
            tx = _MemoryTx(self)
            try:
                result = op(tx)
            except BaseException:
                tx.rollback()
                raise
            self._commits += 1
            return result

    def write(self, op: Callable[[LedgerTx], T], *, durable: bool = True, apart: bool = False) -> T:
        return self._run(op)  # every operation runs at once under one lock: ``apart`` is moot

    def submit(self, op: Callable[[LedgerTx], T], *, durable: bool = True) -> WriteFuture[T]:
        fut: WriteFuture[T] = WriteFuture()
        try:
            result = self._run(op)
        except LedgerUnavailable:
            raise  # like the SQLite writer: a closed store refuses at submit
        except Exception as exc:
            fut._settle(False, exc)
        else:
            fut._settle(True, result)
        return fut

    def submit_async(
        self, op: Callable[[LedgerTx], T], *, durable: bool = True
    ) -> asyncio.Future[T]:
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        try:
            fut.set_result(self._run(op))
        except LedgerUnavailable:
            raise
        except Exception as exc:
            fut.set_exception(exc)
        return fut

    # -- reads -----------------------------------------------------------------------------

    def _select(
        self,
        where: Callable[[dict[str, Any]], bool],
        key: Callable[[dict[str, Any]], Any] | None = None,
        limit: int | None = None,
        reverse: bool = False,
    ) -> list[LedgerRow]:
        with self._lock:
            if self._closed:
                raise LedgerUnavailable(f"the ledger {self.url} is closed")
            found = [r for r in self._rows.values() if where(r)]
        found.sort(key=key or (lambda r: r["_seq"]), reverse=reverse)
        if limit is not None:
            found = found[: max(int(limit), 0)]
        return [_copy_out(r) for r in found]

    def get(self, row_id: str) -> LedgerRow | None:
        rows = self._select(lambda r: r["id"] == row_id)
        return rows[0] if rows else None

    def query(self, query: RowQuery) -> list[LedgerRow]:
        filters = [
            (c, v)
            for c, v in (
                ("state", query.state),
                ("delivery_state", query.delivery_state),
                ("kind", query.kind),
                ("hook", query.hook),
            )
            if v is not None
        ]
        session = query.session
        terms = query.terms
        if terms is not None and not terms:
            return []  # text without a word matches no row

        def where(r: dict[str, Any]) -> bool:
            if any(r[c] != v for c, v in filters):
                return False
            if terms and not holds_terms(r["goal"] or "", terms):
                return False  # a scan: what the SQL backends' text indexes answer
            return session is None or session in (
                r["session_key"],
                r["origin_session_id"],
                r["origin_ui_session_id"],
            )

        return self._select(where, limit=query.limit, reverse=not query.oldest_first)

    def pending_with_event(self, limit: int) -> list[LedgerRow]:
        return self._select(
            lambda r: (
                r["delivery_state"] == "pending"
                and r["completed_at"] is not None
                and r["event"] is not None
            ),
            key=lambda r: (r["completed_at"], r["id"]),
            limit=limit,
        )

    def due(self, now: float, limit: int) -> list[LedgerRow]:
        return self._select(
            lambda r: (
                r["delivery_state"] == "pending" and r["due_at"] is not None and r["due_at"] <= now
            ),
            key=lambda r: r["due_at"],
            limit=limit,
        )

    def next_due_at(self) -> float | None:
        with self._lock:
            dues = [
                r["due_at"]
                for r in self._rows.values()
                if r["delivery_state"] == "pending" and r["due_at"] is not None
            ]
        return min(dues) if dues else None

    def _distinct(self, column: str, where: Callable[[dict[str, Any]], bool]) -> list[str]:
        with self._lock:
            return list(
                dict.fromkeys(
                    r[column] for r in self._rows.values() if r[column] is not None and where(r)
                )
            )

    def pending_holders(self) -> list[str]:
        return self._distinct("holder", lambda r: r["delivery_state"] == "pending")

    def active_owners(self, state: str) -> list[str]:
        return self._distinct("owner", lambda r: r["state"] == state)

    def rows_held_by(self, holder: str, limit: int) -> list[LedgerRow]:
        return self._select(
            lambda r: r["delivery_state"] == "pending" and r["holder"] == holder, limit=limit
        )

    def rows_owned_by(self, owner: str, state: str, limit: int) -> list[LedgerRow]:
        return self._select(lambda r: r["state"] == state and r["owner"] == owner, limit=limit)

    def audit_log(self, row_id: str) -> list[AuditEntry]:
        with self._lock:
            return [
                {"at": at, "action": action, "detail": detail}
                for rid, at, action, detail in self._audit
                if rid == row_id
            ]

    def servers(self) -> list[ServerRecord]:
        with self._lock:
            return sorted(self._servers.values(), key=lambda r: (r.started_at, r.identity))

    def delivery_counts(self) -> dict[str, int]:
        """Rows waiting for delivery, and those of them under a claim (``LedgerViews``)."""
        with self._lock:
            pending = [r for r in self._rows.values() if r["delivery_state"] == "pending"]
            claimed = sum(r["claim_token"] is not None for r in pending)
        return {"pending": len(pending), "claimed": claimed}

    def pending_counts(self, now: float) -> PendingCounts:
        by_state: dict[str, int] = {}
        later = 0
        with self._lock:
            for r in self._rows.values():
                if r["delivery_state"] == "pending":
                    by_state[r["state"]] = by_state.get(r["state"], 0) + 1
                    later += r["next_attempt_at"] > now
        return PendingCounts(by_state, later)

    # -- retention (``LedgerRetention``) ---------------------------------------------------

    @staticmethod
    def _settled(r: dict[str, Any], before: float) -> bool:
        """``storage.sql.SETTLED``, for a row in memory."""
        return (
            r["delivery_state"] in ("delivered", "dropped")
            and r["state"] not in ("queued", "running")
            and r["settled_at"] is not None
            and r["settled_at"] < before
            and r["claim_expires_at"] < before
        )

    def settled_before(
        self, before: float, after: SettledRow | None, limit: int
    ) -> list[SettledRow]:
        start = (after.settled_at, after.id) if after else (float("-inf"), "")
        with self._lock:
            found = [
                SettledRow(r["id"], r["kind"], r["settled_at"], r["origin_session_id"])
                for r in self._rows.values()
                if self._settled(r, before) and (r["settled_at"], r["id"]) > start
            ]
        found.sort(key=lambda s: (s.settled_at, s.id))
        return found[: max(int(limit), 0)]

    def prune_settled(self, ids: list[str], before: float, pruned_at: float, reason: str) -> int:
        with self._lock:
            if self._closed:
                raise LedgerUnavailable(f"the ledger {self.url} is closed")
            gone = {i for i in ids if i in self._rows and self._settled(self._rows[i], before)}
            for row_id in gone:
                r = self._rows.pop(row_id)
                self._tombstones[row_id] = PrunedRow(
                    row_id,
                    r["kind"],
                    r["state"],
                    r["delivery_state"],
                    r["session_key"],
                    r["completed_at"],
                    r["settled_at"],
                    pruned_at,
                    reason,
                )
            if gone:
                self._audit = [a for a in self._audit if a[0] not in gone]
            return len(gone)

    def pruned(self, row_id: str) -> PrunedRow | None:
        with self._lock:
            return self._tombstones.get(row_id)

    def prune_tombstones(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        with self._lock:
            old = sorted(
                (t for t in self._tombstones.values() if t.pruned_at < before),
                key=lambda t: t.pruned_at,
            )[: max(int(limit), 0)]
            if not dry_run:
                for t in old:
                    del self._tombstones[t.id]
            return len(old)

    def take_lease(self, name: str, holder: str, now: float, ttl_seconds: float) -> bool:
        with self._lock:
            current = self._leases.get(name)
            if current is not None and current[0] != holder and current[1] > now:
                return False
            self._leases[name] = (holder, now + ttl_seconds)
            return True

    def stats(self) -> dict[str, int]:
        # Each operation is its own "commit"; nothing is ever fsynced.
        return {"commits": self._commits, "durable_commits": 0, "operations": self._commits}

    def close(self) -> None:
        with self._lock:
            self._closed = True
