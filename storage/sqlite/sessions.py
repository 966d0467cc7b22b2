"""The SQLite session backend: sessions, transcripts, tombstones and idempotency in one file.

The rules are ``delivery.session_rules``'s and the rows ``storage.session_sql``'s; this module
is the file and its transactions. Writes go to one ``GroupCommitWriter`` thread that runs
every waiting write in one ``BEGIN IMMEDIATE`` transaction and commits once, so concurrent
turns share fsyncs and several stores (or processes) on one file stay atomic (and the
writer's order is the only lock a write needs). Reads share one connection under a lock;
coroutines read through one batching reader thread; WAL lets both run beside the writer.
The file is born 0600 and a foreign or newer file is refused unmodified
(``storage.sqlite.files``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from delivery.session_backend import (
    MessageHit,
    MessageRecord,
    NewMessage,
    NewSession,
    SessionStoreError,
)
from delivery.session_rows import SessionRows
from delivery.session_rules import SessionRules
from storage.session_sql import (
    SessionSql,
    SqlSessionRows,
    message_values,
    session_values,
    statements,
)
from storage.sqlite import files as sqlite_files
from storage.sqlite.files import PLACEHOLDER
from storage.sqlite.fts import BatchedIndexing, fts_query
from storage.sqlite.reader import GroupReader
from storage.sqlite.sessions_sql import (
    DDL,
    MESSAGES_BATCH,
    MESSAGES_INDEX,
    REQUIRED_COLUMNS,
    RETENTION_DDL,
    SCHEMA_VERSION,
    SQL_INSERT_NEW_SESSION,
    SQL_SEARCH,
    SQL_SUPERSEDE,
    UPGRADE_COLUMNS,
    sql_insert_messages,
)
from storage.sqlite.writer import GroupCommitWriter

T = TypeVar("T")
_SQL = statements(PLACEHOLDER)
log = logging.getLogger(__name__)


class SqliteRows(SqlSessionRows):
    """The shared rows, with what SQLite spells its own way. On the writer's connection,
    ``inserted`` hears of the messages inserted (the text index's ``BatchedIndexing``)."""

    no_limit = -1

    def __init__(
        self,
        conn: sqlite3.Connection,
        sql: SessionSql,
        inserted: Callable[[int], object] = lambda rows: None,
    ) -> None:
        super().__init__(conn, sql)
        self._inserted = inserted

    def insert_message(self, session_id: str, message_: NewMessage, now: float) -> MessageRecord:
        record = super().insert_message(session_id, message_, now)
        self._inserted(1)
        return record

    def insert_new_session(self, session_id: str, new: NewSession, now: float) -> bool:
        # One statement where ``state`` and ``insert_session`` were two, with a row to read
        # between them: each is a hand-off of the GIL the event loop shares, and the writer
        # thread is where every turn waits.
        values = (*session_values(session_id, new, now), session_id)
        created = self.conn.execute(SQL_INSERT_NEW_SESSION, values).rowcount == 1
        if created:
            self.created(session_id, now)
        return created

    def insert_messages(self, session_id: str, messages: Sequence[NewMessage], now: float) -> None:
        # One statement for the whole turn (the rules checked the session is live).
        values = [v for m in messages for v in message_values(session_id, m, now)]
        self.conn.execute(sql_insert_messages(len(messages)), values)
        self._inserted(len(messages))

    def supersede(self, session_id: str, ids: Sequence[int], how: str) -> int:
        return sum(
            int(self.conn.execute(SQL_SUPERSEDE, (how, session_id, mid)).rowcount) for mid in ids
        )

    def search(self, terms: Sequence[str], limit: int) -> list[MessageHit]:
        rows = self.conn.execute(SQL_SEARCH, (fts_query(list(terms)), limit)).fetchall()
        return [MessageHit(r[0], int(r[1]), r[2], float(r[3]), r[4]) for r in rows]


def _check_columns(spec: sqlite_files.SqliteFile) -> Callable[[sqlite3.Connection], None]:
    # Older files carry no application id; a table of ours missing our columns is how a
    # foreign file shows itself. Runs before any pragma or DDL could modify the file.
    def check(conn: sqlite3.Connection) -> None:
        for table, required in REQUIRED_COLUMNS.items():
            have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            missing = required - have
            if have and missing:
                raise SessionStoreError(
                    f"{spec.path}: table {table!r} exists but lacks columns "
                    f"{sorted(missing)}; this file belongs to something else"
                )

    return check


def _add_columns(conn: sqlite3.Connection, spec: sqlite_files.SqliteFile) -> None:
    """Give an older file the columns added since (``UPGRADE_COLUMNS``), in one transaction
    that reads again what it found: two processes opening one file add each column once."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        for table, column, kind in UPGRADE_COLUMNS:
            have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            if have and column not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise sqlite_files.classify(exc, spec) from exc


def _not_ours(msg: str) -> SessionStoreError:
    return SessionStoreError(
        f"not a usable SQLite database: {msg}; refusing to modify it — move it aside or "
        "point the store elsewhere"
    )


class _SqliteTx:
    """``SessionTx`` over one SQLite file (see the module docstring)."""

    def __init__(self, path: str | Path, *, busy_timeout_ms: int) -> None:
        # FULL: an acknowledged delivery row must survive power loss, or a completion that
        # was marked delivered could vanish from the transcript.
        self.spec = sqlite_files.SqliteFile(
            path=str(path),
            name="session store",
            application_id=None,
            schema_version=SCHEMA_VERSION,
            errors=sqlite_files.FileErrors(
                not_ours=_not_ours, unavailable=SessionStoreError, too_new=SessionStoreError
            ),
            busy_timeout_ms=busy_timeout_ms,
        )
        self._lock = threading.RLock()
        sqlite_files.create_private(self.spec)
        conn = sqlite_files.connect(
            self.spec, check_owner=True, extra_check=_check_columns(self.spec)
        )
        try:
            _add_columns(conn, self.spec)
            sqlite_files.stamp_schema(conn, self.spec, DDL + ";" + RETENTION_DDL)
            # An older file gains its full-text index, with every message already there.
            MESSAGES_INDEX.add_to(conn, self.spec)
        except BaseException:
            conn.close()
            raise
        conn.row_factory = sqlite3.Row
        self._conn: sqlite3.Connection | None = conn
        self.messages_index: BatchedIndexing[SqliteRows] = BatchedIndexing(
            MESSAGES_INDEX,
            batch=MESSAGES_BATCH,
            execute=lambda rows, sql: rows.conn.execute(sql),
            has_tail=self._read_flag,
            unavailable=SessionStoreError,
        )
        self._writer: GroupCommitWriter[SqliteRows] | None = GroupCommitWriter(
            self.spec.path,
            self._open,
            context=lambda c: SqliteRows(c, _SQL, self.messages_index.inserted),
            unavailable=SessionStoreError,
            name="session-writer",
        )
        self.messages_index.writer = self._writer
        # Coroutines read through one batching reader thread (storage.sqlite.reader);
        # threads read on the shared connection above, under the lock.
        self._reader: GroupReader | None = GroupReader(
            self._open,
            classify=lambda exc: sqlite_files.classify(exc, self.spec, "read"),
            unavailable=lambda msg: SessionStoreError(f"session store {self.spec.path}: {msg}"),
            name="session-reader",
        )

    def _open(self) -> sqlite3.Connection:
        conn = sqlite_files.connect(self.spec)
        conn.row_factory = sqlite3.Row
        return conn

    def _closed(self) -> SessionStoreError:
        return SessionStoreError(f"session store {self.spec.path} is closed")

    @property
    def url(self) -> str:
        return f"sqlite:///{self.spec.path.lstrip('/')}"

    def stats(self) -> dict[str, int]:
        if self._writer is None:
            raise self._closed()
        w = self._writer
        return {"writes": w.operations, "commits": w.commits, "durable_commits": w.durable_commits}

    def close(self) -> None:
        if self._writer is not None:
            try:  # a file closed in order holds every message in its index
                self.messages_index.index_now()
            except SessionStoreError:
                log.warning("the messages written last were left for the next search to index")
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def write(self, locks: tuple[str, ...], op: Callable[[SessionRows], T]) -> T:
        if self._writer is None:
            raise self._closed()
        return self._writer.write(op)

    def awrite(self, locks: tuple[str, ...], op: Callable[[SessionRows], T]) -> asyncio.Future[T]:
        if self._writer is None:
            raise self._closed()
        return self._writer.submit_async(op)

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """The reader connection inside one read transaction (one consistent snapshot)."""
        with self._lock:
            if self._conn is None:
                raise self._closed()
            conn = self._conn
            try:
                conn.execute("BEGIN")
                try:
                    yield conn
                finally:
                    conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise sqlite_files.classify(exc, self.spec, "read") from exc

    def _read_flag(self, sql: str) -> bool:
        with self._snapshot() as conn:
            return bool(conn.execute(sql).fetchone()[0])

    def read(self, op: Callable[[SessionRows], T]) -> T:
        with self._snapshot() as conn:
            return op(SqliteRows(conn, _SQL))

    def aread(self, op: Callable[[SessionRows], T]) -> asyncio.Future[T]:
        if self._reader is None:
            raise self._closed()
        return self._reader.submit_async(lambda conn: op(SqliteRows(conn, _SQL)))


class SqliteSessions(SessionRules):
    """``SessionBackend`` over one SQLite file (see the module docstring)."""

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_ms: int = 5000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sqlite = _SqliteTx(path, busy_timeout_ms=busy_timeout_ms)
        super().__init__(self._sqlite, clock)
        self._path = Path(path)

    @property
    def path(self) -> Path:
        return self._path

    def search_messages(self, terms: Sequence[str], limit: int) -> list[MessageHit]:
        # The messages written since the index's last batch are indexed first: no search
        # misses one.
        self._sqlite.messages_index.index_now()
        return super().search_messages(terms, limit)
