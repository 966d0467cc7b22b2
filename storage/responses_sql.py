"""The Responses API's tables in SQL, written once for SQLite and PostgreSQL (``?`` or ``%s``).

``ResponsesSql`` implements ``delivery.responses_backend.ResponsesBackend`` over a
transaction factory its dialect gives (``storage/sqlite/responses.py``,
``storage/postgres/responses.py``, and the in-memory store, a private SQLite database).
Event numbers are drawn inside the appending transaction after locking the response's row
(PostgreSQL ``FOR UPDATE``; SQLite takes the whole file with ``BEGIN IMMEDIATE``), so two
writers can never hand out one number twice, and only the row's owner may append.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from delivery.notifier import Notifier
from delivery.responses_backend import (
    ACTIVE,
    TERMINAL,
    Change,
    QueueCaps,
    QueueFull,
    ResponseEvent,
    ResponseRow,
    storing_owner,
)
from storage.sql import marked

__all__ = ["DDL", "UPGRADE_COLUMNS", "ResponsesSql", "add_sqlite_columns"]

# Shared by both dialects: PostgreSQL's migration 6 is this text, and so is SQLite's
# responses.db version 1.
DDL = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    background INTEGER NOT NULL,
    session_id TEXT NOT NULL,
    previous_response_id TEXT,
    request TEXT NOT NULL,
    body TEXT NOT NULL,
    owner TEXT,
    lease_until DOUBLE PRECISION NOT NULL DEFAULT 0,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    completed_at DOUBLE PRECISION,
    idempotency_key TEXT UNIQUE,
    fingerprint TEXT,
    notified INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS ix_responses_status ON responses (status, created_at);
CREATE INDEX IF NOT EXISTS ix_responses_completed ON responses (completed_at);
CREATE INDEX IF NOT EXISTS ix_responses_unnotified ON responses (completed_at) WHERE notified = 0;
CREATE TABLE IF NOT EXISTS response_events (
    response_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (response_id, seq)
)
"""

# Columns added after ``DDL`` (PostgreSQL's migration 9; SQLite's version 2): table,
# column, type.
UPGRADE_COLUMNS = (("responses", "caller", "TEXT"),)

_COLUMNS = (
    "id, status, background, session_id, request, body, created_at, updated_at, "
    "previous_response_id, owner, lease_until, completed_at, idempotency_key, fingerprint, "
    "notified, caller"
)


def add_sqlite_columns(conn: Any) -> None:
    """Give a SQLite database made from ``DDL`` the ``UPGRADE_COLUMNS`` it lacks, in one
    transaction that reads again what it found (two processes add each column once)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table, column, kind in UPGRADE_COLUMNS:
            have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _runs(owner: str) -> tuple[str, str]:
    """The owners a row has while ``owner`` runs it: running, then storing its turn."""
    return owner, storing_owner(owner)


def _queued(run: Callable[..., Any], caller: str | None) -> tuple[int, int]:
    found = run(
        "SELECT count(*), count(CASE WHEN caller = ? THEN 1 END) FROM responses "
        "WHERE status = 'queued'",
        caller,
    ).fetchone()
    return int(found[0]), int(found[1] or 0)


def _check_caps(total: int, own: int, caps: QueueCaps) -> None:
    if own >= caps.per_caller:
        raise QueueFull(
            "too many background responses queued for this key "
            f"(max_queued_per_key = {caps.per_caller}); retry once some have started, or "
            "cancel some",
            per_key=True,
        )
    if total >= caps.total:
        raise QueueFull(
            f"too many background responses queued (max_queued = {caps.total}); retry shortly",
            per_key=False,
        )


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Exec(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...


def _row(r: Sequence[Any]) -> ResponseRow:
    return ResponseRow(
        id=str(r[0]),
        status=str(r[1]),
        background=bool(r[2]),
        session_id=str(r[3]),
        request=str(r[4]),
        body=str(r[5]),
        created_at=float(r[6]),
        updated_at=float(r[7]),
        previous_response_id=r[8],
        owner=r[9],
        lease_until=float(r[10] or 0.0),
        completed_at=None if r[11] is None else float(r[11]),
        idempotency_key=r[12],
        fingerprint=r[13],
        notified=bool(r[14]),
        caller=r[15],
    )


class ResponsesSql:
    """``ResponsesBackend`` over ``tx()`` (a context manager giving an ``Exec`` inside one
    transaction); ``mark`` is the dialect's placeholder, ``lock`` what locks a selected row."""

    def __init__(
        self,
        mark: str,
        tx: Callable[[], AbstractContextManager[Exec]],
        *,
        lock: str,
        notifier: Notifier,
        close: Callable[[], None] = lambda: None,
        read: Callable[[], AbstractContextManager[Exec]] | None = None,
    ) -> None:
        """``read``: a plain read's connection where it differs from ``tx`` (SQLite: no
        write lock, so readers never queue behind the event appends); ``tx`` by default."""
        self._tx = tx
        self._read_tx = read or tx
        self._mark = mark
        self._lock = lock
        self._notifier = notifier
        self._close = close

    @property
    def notifier(self) -> Notifier:
        return self._notifier

    def close(self) -> None:
        self._close()

    def _q(self, sql: str) -> str:
        return marked(sql, self._mark)

    @contextlib.contextmanager
    def _run(self, *, read: bool = False) -> Iterator[Callable[..., Any]]:
        with (self._read_tx if read else self._tx)() as conn:

            def run(sql: str, *params: Any) -> Any:
                return conn.execute(self._q(sql), params)

            yield run

    def _append(
        self, run: Callable[..., Any], response_id: str, events: list[tuple[str, str]]
    ) -> None:
        if not events:
            return
        top = run("SELECT max(seq) FROM response_events WHERE response_id = ?", response_id)
        found = top.fetchone()
        seq = -1 if found is None or found[0] is None else int(found[0])
        for type_, data in events:
            seq += 1
            run(
                "INSERT INTO response_events (response_id, seq, type, data) VALUES (?, ?, ?, ?)",
                response_id,
                seq,
                type_,
                data,
            )

    # ----------------------------------------------------------------- writes

    def insert(
        self, row: ResponseRow, events: list[tuple[str, str]], caps: QueueCaps | None = None
    ) -> ResponseRow:
        with self._run() as run:
            if caps is not None:
                if row.idempotency_key is not None:
                    found = run(
                        f"SELECT {_COLUMNS} FROM responses WHERE idempotency_key = ?",
                        row.idempotency_key,
                    ).fetchone()
                    if found is not None:
                        return _row(found)  # a repeat: answered, never refused
                # SQLite's write lock makes the count exact; under PostgreSQL's read
                # committed, creates at the same instant may each see room for one more.
                _check_caps(*_queued(run, row.caller), caps)
            cur = run(
                f"INSERT INTO responses ({_COLUMNS}) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                row.id,
                row.status,
                int(row.background),
                row.session_id,
                row.request,
                row.body,
                row.created_at,
                row.updated_at,
                row.previous_response_id,
                row.owner,
                row.lease_until,
                row.completed_at,
                row.idempotency_key,
                row.fingerprint,
                int(row.notified),
                row.caller,
            )
            if cur.rowcount == 1:
                self._append(run, row.id, events)
                return row
            where, value = (
                ("idempotency_key", row.idempotency_key)
                if row.idempotency_key is not None
                else ("id", row.id)
            )
            found = run(f"SELECT {_COLUMNS} FROM responses WHERE {where} = ?", value).fetchone()
        if found is None:  # pragma: no cover - a conflict on a row deleted at that instant
            raise RuntimeError(f"response {row.id} conflicts with a row that is gone")
        return _row(found)

    def transition(
        self,
        response_id: str,
        *,
        expect: tuple[str, ...],
        owner: str | None,
        change: Change,
        events: list[tuple[str, str]] | None = None,
        check_owner: bool = True,
    ) -> bool:
        marks = ", ".join("?" for _ in expect)
        with self._run() as run:
            now_row = run(
                f"SELECT status, owner FROM responses WHERE id = ?{self._lock}", response_id
            ).fetchone()
            if now_row is None or now_row[0] not in expect:
                return False
            if check_owner and now_row[1] != owner:
                return False
            run(
                "UPDATE responses SET status = ?, body = ?, owner = ?, lease_until = ?, "
                "completed_at = ?, updated_at = ?, notified = ? "
                f"WHERE id = ? AND status IN ({marks})",
                change.status,
                change.body,
                change.owner,
                change.lease_until,
                change.completed_at,
                change.completed_at or time.time(),
                int(change.notified),
                response_id,
                *expect,
            )
            self._append(run, response_id, events or [])
        return True

    def append_events(self, response_id: str, owner: str, events: list[tuple[str, str]]) -> bool:
        with self._run() as run:
            row = run(
                f"SELECT status, owner FROM responses WHERE id = ?{self._lock}", response_id
            ).fetchone()
            # The run's own, also while it stores its finished turn (its storing owner).
            if row is None or row[0] != "in_progress" or row[1] not in _runs(owner):
                return False
            self._append(run, response_id, events)
        return True

    def renew(self, response_id: str, owner: str, lease_until: float) -> bool:
        with self._run() as run:
            cur = run(
                "UPDATE responses SET lease_until = ? "
                "WHERE id = ? AND owner IN (?, ?) AND status = 'in_progress'",
                lease_until,
                response_id,
                *_runs(owner),
            )
            return bool(cur.rowcount == 1)

    def mark_notified(self, response_id: str) -> None:
        with self._run() as run:
            run("UPDATE responses SET notified = 1 WHERE id = ?", response_id)

    def delete(self, response_id: str) -> bool:
        with self._run() as run:
            run("DELETE FROM response_events WHERE response_id = ?", response_id)
            cur = run("DELETE FROM responses WHERE id = ?", response_id)
            return bool(cur.rowcount == 1)

    def prune(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        terminal = ", ".join("?" for _ in TERMINAL)
        # Terminal, ended before ``before`` and its terminal hook run (``notified``): a row
        # whose webhook is not in the ledger yet is still owed to its receivers.
        pick = (
            "SELECT id FROM responses WHERE completed_at < ? AND notified = 1"
            f" AND status IN ({terminal}) ORDER BY completed_at, id LIMIT ?"
        )
        params = (before, *TERMINAL, int(limit))
        with self._run() as run:
            ids = [str(r[0]) for r in run(pick, *params).fetchall()]
            if dry_run or not ids:
                return len(ids)
            marks = ", ".join("?" for _ in ids)
            run(f"DELETE FROM response_events WHERE response_id IN ({marks})", *ids)
            # No re-check needed: a terminal status is final, so a picked row stays prunable.
            cur = run(f"DELETE FROM responses WHERE id IN ({marks})", *ids)
            return int(cur.rowcount or 0)

    # ----------------------------------------------------------------- reads

    def get(self, response_id: str) -> ResponseRow | None:
        with self._run(read=True) as run:
            found = run(f"SELECT {_COLUMNS} FROM responses WHERE id = ?", response_id).fetchone()
        return None if found is None else _row(found)

    def queued(self, caller: str | None) -> tuple[int, int]:
        with self._run(read=True) as run:
            return _queued(run, caller)

    def events_after(self, response_id: str, after: int, limit: int) -> list[ResponseEvent]:
        with self._run(read=True) as run:
            rows = run(
                "SELECT seq, type, data FROM response_events WHERE response_id = ? AND seq > ? "
                "ORDER BY seq LIMIT ?",
                response_id,
                after,
                limit,
            ).fetchall()
        return [ResponseEvent(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def active(self, limit: int) -> list[ResponseRow]:
        with self._run(read=True) as run:
            rows = run(
                f"SELECT {_COLUMNS} FROM responses WHERE status IN (?, ?) "
                "ORDER BY created_at LIMIT ?",
                *ACTIVE,
                limit,
            ).fetchall()
        return [_row(r) for r in rows]

    def status_counts(self) -> dict[str, int]:
        with self._run(read=True) as run:
            rows = run("SELECT status, COUNT(*) FROM responses GROUP BY status").fetchall()
        return {str(status): int(count) for status, count in rows}

    def unnotified(self, limit: int) -> list[ResponseRow]:
        terminal = ", ".join("?" for _ in TERMINAL)
        with self._run(read=True) as run:
            rows = run(
                f"SELECT {_COLUMNS} FROM responses WHERE notified = 0 "
                f"AND status IN ({terminal}) ORDER BY completed_at LIMIT ?",
                *TERMINAL,
                limit,
            ).fetchall()
        return [_row(r) for r in rows]
