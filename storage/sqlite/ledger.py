"""The embedded SQLite ledger: WAL, one writer thread with group commit, FULL where it matters.

Every write goes through one dedicated writer thread. It takes all operations that are
waiting, runs each in its own savepoint inside one ``BEGIN IMMEDIATE`` transaction and
commits once, so concurrent operations share one fsync of the log instead of paying one each.
A failing operation rolls back to its savepoint and fails alone. Reads use a connection per
calling thread; WAL lets them run beside the writer.

Several processes may open the same file: ``BEGIN IMMEDIATE`` with a busy timeout serialises
their writers, and every transition is a compare-and-set, so no two of them can both win.
They wake each other through the socket directory beside the file (``storage.sqlite.notifier``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from delivery.backend import COLUMNS, JSON_COLUMNS, LedgerTx, Update, check_columns
from delivery.errors import (
    DuplicateDeliveryError,
    LedgerError,
    LedgerUnavailable,
    NotALedgerError,
)
from delivery.peers import ServerRecord
from delivery.rows import AuditEntry, LedgerRow, PendingCounts, PrunedRow, RowQuery, SettledRow
from delivery.states import ACTIVE_STATES
from delivery.write_future import WriteFuture
from storage.sql import (
    PENDING_COUNTS,
    SETTLED,
    TOMBSTONE_COLUMNS,
    WAITING_HELD_BY,
    GoalSearch,
    UpdateCompiler,
    decode_columns,
    decode_row,
    dump_json,
    marked,
    pending_counts,
    query_filter,
    settled_page,
)
from storage.sqlite import files as sqlite_files
from storage.sqlite.files import PLACEHOLDER
from storage.sqlite.fts import BatchedIndexing, TextIndex, fts_query
from storage.sqlite.notifier import SocketDirNotifier, wake_dir_for
from storage.sqlite.webhooks_sql import WEBHOOK_DDL
from storage.sqlite.writer import GroupCommitWriter

T = TypeVar("T")
log = logging.getLogger(__name__)

APPLICATION_ID = 0x52564C4C  # "RVLL": marks a file as ours so we never write into another's
# 2: the webhook tables (storage.sqlite.webhooks_sql), added to version-1 files on open.
# 3: RETENTION_SCHEMA (retention); every statement is IF NOT EXISTS, so a v1 or v2 file
# gains it on open and nothing else changes.
# 4: ``deliveries.progress`` (what a running unit last reported), added to older files on open.
# 5: ``deliveries_fts`` (GOALS_INDEX), built with the rows already there on open.
# 6: ``deliveries.not_before`` (a completion due later: a timer), added to older files on open.
# 7: ``deliveries.hook`` (the hook an open ``wake_when`` wait listens on) and its index over
# pending rows, added to older files on open with the pending waits' hooks filled in.
SCHEMA_VERSION = 7

# The rows ``ix_state_owner`` keeps: work that is queued or running (``ACTIVE_STATES``), the
# only states recovery asks it for. Spelled out in each query it answers, too: SQLite uses a
# partial index only where the query's own terms imply its WHERE.
_ACTIVE = "state IN ({})".format(", ".join(f"'{s.value}'" for s in sorted(ACTIVE_STATES)))

_LEDGER_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS deliveries (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    delivery_state TEXT NOT NULL,
    session_key TEXT,
    origin_session_id TEXT,
    origin_ui_session_id TEXT,
    goal TEXT,
    request TEXT,
    event TEXT,
    owner TEXT,
    holder TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    started_at REAL,
    completed_at REAL,
    claim_token TEXT,
    claim_consumer TEXT,
    claimed_at REAL,
    claim_expires_at REAL NOT NULL DEFAULT 0,
    delivery_attempts INTEGER NOT NULL DEFAULT 0,
    refunds INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL DEFAULT 0,
    due_at REAL,
    settled_at REAL,
    settled_reason TEXT,
    replay_from REAL,
    restored INTEGER NOT NULL DEFAULT 0,
    progress TEXT,
    not_before REAL,
    hook TEXT
);
CREATE INDEX IF NOT EXISTS ix_pending ON deliveries(due_at, holder)
    WHERE delivery_state = 'pending';
CREATE INDEX IF NOT EXISTS ix_pending_hook ON deliveries(hook)
    WHERE delivery_state = 'pending' AND hook IS NOT NULL;
CREATE INDEX IF NOT EXISTS ix_state_owner ON deliveries(state, owner) WHERE {_ACTIVE};
CREATE INDEX IF NOT EXISTS ix_session_key ON deliveries(session_key)
    WHERE session_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS ix_origin_session ON deliveries(origin_session_id)
    WHERE origin_session_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS ix_origin_ui_session ON deliveries(origin_ui_session_id)
    WHERE origin_ui_session_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS delivery_audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id TEXT NOT NULL,
    at REAL NOT NULL,
    action TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_audit_delivery ON delivery_audit(delivery_id, seq);
CREATE TABLE IF NOT EXISTS servers (
    identity TEXT PRIMARY KEY,
    label TEXT NOT NULL,
    started_at REAL NOT NULL,
    heartbeat_at REAL NOT NULL
);
"""
_SCHEMA = _LEDGER_SCHEMA + WEBHOOK_DDL

# Four indexes leave out the rows whose column is NULL: no query looks a row up by a missing
# hook or session (each compares the column, or asks for it NOT NULL; a session's rows are
# found by ``session_key = ? OR origin_session_id = ? OR ...``, one index per term), and a
# new row has no hook and mostly one or two of the three session ids. So its insert, and
# the acknowledgement of a row without a hook, no longer write those indexes' pages into
# the log. A file made before keeps its older, wider indexes until it is opened by this
# version, which rebuilds them once (``_narrow_indexes``); an older version opening the file
# after that finds the indexes by their names and leaves them as they are.
# ``ix_state_owner`` keeps only the rows whose work is queued or running, the only states
# recovery asks it for (``ACTIVE_STATES``): a finished row leaves it instead of moving to
# the far end of an index that grew with every row ever written. Each value: the index's
# statement, and the text that tells its current form in ``sqlite_master``.
_NARROWED = {
    name: (
        f"CREATE INDEX {name} ON deliveries({column}) WHERE {pending}{column} IS NOT NULL",
        "IS NOT NULL",
    )
    for name, column, pending in (
        ("ix_pending_hook", "hook", "delivery_state = 'pending' AND "),
        ("ix_session_key", "session_key", ""),
        ("ix_origin_session", "origin_session_id", ""),
        ("ix_origin_ui_session", "origin_ui_session_id", ""),
    )
} | {
    "ix_state_owner": (
        f"CREATE INDEX ix_state_owner ON deliveries(state, owner) WHERE {_ACTIVE}",
        "WHERE state IN",
    ),
    # Below: built in an earlier form by a build of this version's own making.
    "ix_pending": (
        "CREATE INDEX ix_pending ON deliveries(due_at, holder) WHERE delivery_state = 'pending'",
        "(due_at, holder)",
    ),
}
# ``ix_pending`` holds every pending row, keyed by its due time (NULL while its work runs)
# and its holder: the due rows and the earliest due time are a range of it; the counts of
# pending rows, restore's scan and the holders (``pending_holders``, read again only once
# the deliveries changed; ``rows_held_by``: a holder's rows are looked for only once it is
# dead) read all of it, as they read an index over the same rows before. It replaces three
# indexes that files made before have (``_MERGED``, dropped on open): of due times, of
# completion times and of holders, over the same rows. Each was written by two or three of
# an item's four commits (the insert, the terminal row, the acknowledgement); the one index
# is written once by each of those, four pages less per item, each fsynced.
_MERGED = ("ix_pending_due", "ix_pending_completed", "ix_pending_holder")
# Recovery's two queries, answered by ``ix_state_owner``.
SQL_ACTIVE_OWNERS = (
    f"SELECT DISTINCT owner FROM deliveries WHERE {_ACTIVE} AND state = ? AND owner IS NOT NULL"
)

# Retention (``delivery.retention``): the settled rows by age, the tombstones pruned rows
# leave, and the lease that lets one server at a time prune.
RETENTION_SCHEMA = """
CREATE INDEX IF NOT EXISTS ix_settled ON deliveries(settled_at, id)
    WHERE delivery_state IN ('delivered', 'dropped');
CREATE TABLE IF NOT EXISTS delivery_tombstones (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    delivery_state TEXT NOT NULL,
    session_key TEXT,
    completed_at REAL,
    settled_at REAL,
    pruned_at REAL NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_tombstones_pruned ON delivery_tombstones(pruned_at);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL
);
"""

# v5: an FTS5 index over the goals (``RowQuery.text``; ``storage.sqlite.fts``), built with
# the rows already there when an older file opens. It only answers MATCH, so it keeps no
# column sizes (one page less per insert); an index built with them is rebuilt without,
# once, on open. It is batched: a new row's goal is indexed with the rows written after it,
# ``GOALS_BATCH`` at a time, by an operation the writer thread commits after the insert that
# filled the batch, and before any search (``SqliteBackend.query``), so no search misses a
# row; the insert of a row no longer writes the index's two to three pages into the log
# that the row's own fsync waits for. Triggers keep the rows indexed so far in step with
# retention's deletes and a change of a goal, in the same transaction.
GOALS_INDEX = TextIndex("deliveries_fts", "deliveries", "goal", column_sizes=False, batched=True)
GOALS_BATCH = 128
GOAL_SEARCH = GoalSearch(
    "rowid IN (SELECT rowid FROM deliveries_fts WHERE deliveries_fts MATCH ?)", fts_query
)

_SETTLED = marked(SETTLED, PLACEHOLDER)
_PENDING_COUNTS = marked(PENDING_COUNTS, PLACEHOLDER)
_SETTLED_PAGE = settled_page(PLACEHOLDER)
_PRUNE_PICK = "id IN (SELECT value FROM json_each(?))"
_SQL_TOMBSTONE_PRUNED = (
    f"INSERT INTO delivery_tombstones ({TOMBSTONE_COLUMNS})"
    " SELECT id, kind, state, delivery_state, session_key, completed_at, settled_at, ?, ?"
    f" FROM deliveries WHERE {_PRUNE_PICK} AND {_SETTLED}"
    " ON CONFLICT (id) DO UPDATE SET pruned_at = excluded.pruned_at, reason = excluded.reason"
)
_SQL_PRUNE_AUDIT = (
    "DELETE FROM delivery_audit WHERE delivery_id IN"
    f" (SELECT id FROM deliveries WHERE {_PRUNE_PICK} AND {_SETTLED})"
)
_SQL_PRUNE_ROWS = f"DELETE FROM deliveries WHERE {_PRUNE_PICK} AND {_SETTLED}"
_SQL_TAKE_LEASE = (
    "INSERT INTO leases (name, holder, expires_at) VALUES (?, ?, ?)"
    " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at"
    " WHERE leases.expires_at <= ? OR leases.holder = excluded.holder"
)

_SELECT = f"SELECT {', '.join(COLUMNS)} FROM deliveries"
SQL_OWNED_BY = f"{_SELECT} WHERE {_ACTIVE} AND state = ? AND owner = ? LIMIT ?"


def _params(values: dict[str, Any], cols: tuple[str, ...]) -> list[Any]:
    params = [values[c] for c in cols]
    for i, col in enumerate(cols):
        if col in JSON_COLUMNS and params[i] is not None:
            params[i] = dump_json(params[i])
    return params


_FILE_ERRORS = sqlite_files.FileErrors(
    not_ours=NotALedgerError, unavailable=LedgerUnavailable, too_new=LedgerError
)


# Columns added after version 1, in the order they came: an older file gains them on open.
_ADDED_COLUMNS = (("progress", "TEXT"), ("not_before", "REAL"), ("hook", "TEXT"))  # v4, v6, v7
# What an added column needs filled in on the rows already there: the waits still open find
# their events by ``hook`` from now on.
_BACKFILLS = {
    "hook": "UPDATE deliveries SET hook = json_extract(event, '$.hook')"
    " WHERE kind = 'wake_when' AND delivery_state = 'pending' AND json_valid(event)"
}


def _narrow_indexes(conn: sqlite3.Connection, spec: sqlite_files.SqliteFile) -> None:
    """Rebuild, once, an index of ``_NARROWED`` that a file made before still has in its
    wider form, and drop the indexes ``ix_pending`` replaced (``_MERGED``); one transaction,
    and a file that has them as they should be takes no write lock."""
    found = "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?"

    def wide() -> list[str]:
        return [
            name
            for name, (_, marker) in _NARROWED.items()
            if marker not in ((conn.execute(found, (name,)).fetchone() or ("",))[0] or "")
        ]

    def merged() -> list[str]:
        return [name for name in _MERGED if conn.execute(found, (name,)).fetchone()]

    if not wide() and not merged():
        return
    try:
        conn.execute("BEGIN IMMEDIATE")
        for name in wide():  # again under the lock: another process may have just done it
            conn.execute(f"DROP INDEX IF EXISTS {name}")
            conn.execute(_NARROWED[name][0])
        for name in merged():
            conn.execute(f"DROP INDEX {name}")
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise sqlite_files.classify(exc, spec) from exc


def _add_columns(conn: sqlite3.Connection) -> None:
    """A file written before a column of ``_ADDED_COLUMNS`` existed gains it (SQLite has no
    ``ADD COLUMN IF NOT EXISTS``, so the table is looked at first)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(deliveries)")}
    for name, sql_type in _ADDED_COLUMNS:
        if columns and name not in columns:
            conn.execute(f"ALTER TABLE deliveries ADD COLUMN {name} {sql_type}")
            if name in _BACKFILLS:
                conn.execute(_BACKFILLS[name])


# ``LedgerTx.adopt_waiting``: this transaction is the file's only writer, so no row it picks
# is another's.
_ADOPT_WAITING = (
    "UPDATE deliveries SET holder = ?, updated_at = ?"
    f" WHERE id IN (SELECT id FROM deliveries WHERE {WAITING_HELD_BY} LIMIT ?)"
)


class _RowWrites:
    """How many inserts and updates of ``deliveries`` this process's writer has run; it
    only grows (counted inside each operation, rolled back or not)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class _HoldersMemo(NamedTuple):
    """``pending_holders``' last answer, and the deliveries' version it was read at (None:
    not known)."""

    version: tuple[int, int] | None
    holders: list[str]


class _SqliteTx:
    """The ``LedgerTx`` of one operation, on the writer's connection. ``inserted`` hears of
    every row inserted (from inside that operation: the goals' ``BatchedIndexing``);
    ``row_writes`` counts the inserts and updates of ``deliveries``."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        inserted: Callable[[int], object],
        row_writes: _RowWrites,
    ) -> None:
        self._conn = conn
        self._inserted = inserted
        self._row_writes = row_writes
        self._updates = UpdateCompiler(PLACEHOLDER)
        self._select_sql: dict[tuple[str, ...], str] = {}
        self._insert_sql: dict[tuple[str, ...], str] = {}

    def get(self, row_id: str, columns: tuple[str, ...] | None = None) -> dict[str, Any] | None:
        columns = columns or COLUMNS
        sql = self._select_sql.get(columns)
        if sql is None:
            check_columns(columns)
            sql = self._select_sql[columns] = (
                f"SELECT {', '.join(columns)} FROM deliveries WHERE id = ?"
            )
        found = self._conn.execute(sql, (row_id,)).fetchone()
        return None if found is None else decode_columns(found, columns)

    def insert(self, row: dict[str, Any]) -> None:
        cols = tuple(row)
        sql = self._insert_sql.get(cols)
        if sql is None:
            check_columns(cols)
            sql = self._insert_sql[cols] = (
                f"INSERT INTO deliveries ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
            )
        self._row_writes.count += 1
        try:
            self._conn.execute(sql, _params(row, cols))
        except sqlite3.IntegrityError as exc:
            raise DuplicateDeliveryError(f"a ledger row with id {row['id']!r} exists") from exc
        self._inserted(1)

    def update(self, row_id: str, expect: dict[str, Any], changes: dict[str, Any]) -> bool:
        self._row_writes.count += 1
        return self._conn.execute(*self._updates.statement(row_id, expect, changes)).rowcount == 1

    def update_many(self, updates: list[Update]) -> list[bool]:
        return [self.update(*one) for one in updates]  # in process: no trip to save

    def adopt_waiting(self, holder: str, identity: str, now: float, limit: int) -> int:
        adopted: int = self._conn.execute(
            _ADOPT_WAITING, (identity, now, holder, now, limit)
        ).rowcount
        self._row_writes.count += adopted
        return adopted

    def lock_free(self, row_ids: list[str]) -> set[str]:
        return set(row_ids)  # BEGIN IMMEDIATE: this transaction is the file's only writer

    def audit(self, row_id: str, action: str, detail: str, at: float) -> None:
        self._conn.execute(
            "INSERT INTO delivery_audit (delivery_id, at, action, detail) VALUES (?, ?, ?, ?)",
            (row_id, at, action, detail),
        )

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """A statement of this backend's own (retention), on the writer's connection."""
        return self._conn.execute(sql, params)

    def put_server(self, record: ServerRecord) -> None:
        self._conn.execute(
            "INSERT INTO servers (identity, label, started_at, heartbeat_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (identity) DO UPDATE SET label = excluded.label, "
            "heartbeat_at = excluded.heartbeat_at",
            (record.identity, record.label, record.started_at, record.heartbeat_at),
        )

    def delete_server(self, identity: str) -> bool:
        cur = self._conn.execute("DELETE FROM servers WHERE identity = ?", (identity,))
        return cur.rowcount == 1


class SqliteBackend:
    """``LedgerBackend`` and ``LedgerViews`` on one SQLite file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_ms: int = 5000,
        max_batch: int = 1024,
    ) -> None:
        self._file = sqlite_files.SqliteFile(
            str(path),
            name="ledger",
            application_id=APPLICATION_ID,
            schema_version=SCHEMA_VERSION,
            errors=_FILE_ERRORS,
            busy_timeout_ms=busy_timeout_ms,
        )
        # The file's absolute path: SQLite-specific (tests, the CLI's messages); the ledger
        # itself only knows ``url``.
        self.path = self._file.path
        # Processes sharing this file poke each other through sockets beside it.
        self._notifier = SocketDirNotifier(wake_dir_for(self.path))
        self._max_batch = max_batch
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self._row_writes = _RowWrites()
        self._holders_memo: _HoldersMemo | None = None
        self._prepare_file()
        self._goals: BatchedIndexing[_SqliteTx] = BatchedIndexing(
            GOALS_INDEX,
            batch=GOALS_BATCH,
            execute=lambda tx, sql: tx.execute(sql),
            has_tail=lambda sql: bool(self._scalars(sql)[0]),
            unavailable=LedgerUnavailable,
        )
        self._writer: GroupCommitWriter[_SqliteTx] = GroupCommitWriter(
            self.path,
            self._open_writer,
            context=lambda conn: _SqliteTx(conn, self._goals.inserted, self._row_writes),
            unavailable=LedgerUnavailable,
            name="ledger-writer",
            max_batch=max_batch,
        )
        self._goals.writer = self._writer

    # -- opening ---------------------------------------------------------------------------

    def _prepare_file(self) -> None:
        sqlite_files.create_private(self._file)

    def _connect(self, *, check_owner: bool = False) -> sqlite3.Connection:
        return sqlite_files.connect(self._file, check_owner=check_owner)

    def _open_writer(self) -> sqlite3.Connection:
        conn = self._connect(check_owner=True)
        try:
            _add_columns(conn)
            sqlite_files.stamp_schema(conn, self._file, _SCHEMA + RETENTION_SCHEMA)
            _narrow_indexes(conn, self._file)
            GOALS_INDEX.add_to(conn, self._file)
        except BaseException:
            conn.close()
            raise
        return conn

    # -- what it is, and its wake-ups --------------------------------------------------------

    @property
    def url(self) -> str:
        return f"sqlite://{self.path}"  # an absolute path: sqlite:///abs/path/ledger.db

    @property
    def notifier(self) -> SocketDirNotifier:
        return self._notifier

    # -- writes ---------------------------------------------------------------------------

    def submit(self, op: Callable[[LedgerTx], T], *, durable: bool = True) -> WriteFuture[T]:
        return self._writer.submit(op, durable=durable)

    def submit_async(
        self, op: Callable[[LedgerTx], T], *, durable: bool = True
    ) -> asyncio.Future[T]:
        return self._writer.submit_async(op, durable=durable)

    def write(self, op: Callable[[LedgerTx], T], *, durable: bool = True, apart: bool = False) -> T:
        # One writer connection: ``apart`` has no other to run on.
        return self._writer.submit(op, durable=durable).result()

    # -- reads -----------------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise LedgerUnavailable("the ledger is closed")
            conn = self._connect()
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[LedgerRow]:
        try:
            cur = self._reader().execute(sql, params)
            return [decode_row(r) for r in cur.fetchall()]
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"ledger read failed: {exc}") from exc

    def _scalars(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        try:
            return [r[0] for r in self._reader().execute(sql, params).fetchall()]
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"ledger read failed: {exc}") from exc

    def get(self, row_id: str) -> LedgerRow | None:
        rows = self._rows(f"{_SELECT} WHERE id = ?", (row_id,))
        return rows[0] if rows else None

    def query(self, query: RowQuery) -> list[LedgerRow]:
        if query.terms:
            self._goals.index_now()
        where, params = query_filter(PLACEHOLDER, query, GOAL_SEARCH)
        # rowid is the order rows were written in: no index on created_at needed
        sql = f"{_SELECT}{where} ORDER BY rowid {'ASC' if query.oldest_first else 'DESC'} LIMIT ?"
        params.append(int(query.limit))
        return self._rows(sql, params)

    def pending_with_event(self, limit: int) -> list[LedgerRow]:
        return self._rows(
            f"{_SELECT} WHERE delivery_state = 'pending' AND completed_at IS NOT NULL "
            "AND event IS NOT NULL ORDER BY completed_at, id LIMIT ?",
            (int(limit),),
        )

    def due(self, now: float, limit: int) -> list[LedgerRow]:
        return self._rows(
            f"{_SELECT} WHERE delivery_state = 'pending' AND due_at <= ? ORDER BY due_at LIMIT ?",
            (now, int(limit)),
        )

    def next_due_at(self) -> float | None:
        found = self._scalars(
            "SELECT min(due_at) FROM deliveries"
            " WHERE delivery_state = 'pending' AND due_at IS NOT NULL"  # a range of ix_pending
        )
        return found[0] if found else None

    def pending_holders(self) -> list[str]:
        # A scan of all of ``ix_pending`` (this file keeps no index of holders, see there):
        # 7 ms at 90,000 pending, twice in each pass of the re-offer scheduler, which an
        # idle server makes every few seconds to renew its heartbeat. So the answer is kept
        # with the version of the deliveries it was read at, and given again while no
        # process has changed them since.
        version = self._deliveries_version()
        memo = self._holders_memo
        if version is not None and memo is not None and memo.version == version:
            return list(memo.holders)
        holders = self._scalars(
            "SELECT DISTINCT holder FROM deliveries "
            "WHERE delivery_state = 'pending' AND holder IS NOT NULL"
        )
        self._holders_memo = _HoldersMemo(version, holders)
        return list(holders)

    def _deliveries_version(self) -> tuple[int, int] | None:
        """What changes whenever a row of ``deliveries`` may have: the writer connection's
        ``data_version`` (it moves when another connection commits, never for its own
        commits) and this process's count of writes to them, both read inside one write
        transaction (the file's lock held: no other process commits meanwhile). Equal twice,
        nothing was committed to the deliveries in between. The transaction writes nothing:
        no fsync; a lone caller runs it on its own thread. None when the writer cannot run
        it (the file is gone or locked): the caller reads afresh, as it would without."""

        def op(tx: _SqliteTx) -> tuple[int, int]:
            return int(tx.execute("PRAGMA data_version").fetchone()[0]), self._row_writes.count

        try:
            return self._writer.submit(op, durable=False).result()
        except LedgerUnavailable:
            return None

    def active_owners(self, state: str) -> list[str]:
        return self._scalars(SQL_ACTIVE_OWNERS, (state,))

    def rows_held_by(self, holder: str, limit: int) -> list[LedgerRow]:
        return self._rows(
            f"{_SELECT} WHERE delivery_state = 'pending' AND holder = ? LIMIT ?",
            (holder, int(limit)),
        )

    def rows_owned_by(self, owner: str, state: str, limit: int) -> list[LedgerRow]:
        return self._rows(SQL_OWNED_BY, (state, owner, int(limit)))

    def audit_log(self, row_id: str) -> list[AuditEntry]:
        try:
            cur = self._reader().execute(
                "SELECT at, action, detail FROM delivery_audit WHERE delivery_id = ? ORDER BY seq",
                (row_id,),
            )
            return [{"at": at, "action": a, "detail": d} for at, a, d in cur.fetchall()]
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"ledger read failed: {exc}") from exc

    def servers(self) -> list[ServerRecord]:
        try:
            cur = self._reader().execute(
                "SELECT identity, label, started_at, heartbeat_at FROM servers "
                "ORDER BY started_at, identity"
            )
            return [ServerRecord(*row) for row in cur.fetchall()]
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"ledger read failed: {exc}") from exc

    def delivery_counts(self) -> dict[str, int]:
        """Rows waiting for delivery, and those of them under a claim (``LedgerViews``)."""
        try:
            pending, claimed = (
                self._reader()
                .execute(
                    "SELECT COUNT(*), COUNT(claim_token) FROM deliveries "
                    "WHERE delivery_state = 'pending'"
                )
                .fetchone()
            )
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"ledger read failed: {exc}") from exc
        return {"pending": int(pending or 0), "claimed": int(claimed or 0)}

    def pending_counts(self, now: float) -> PendingCounts:
        try:
            rows = self._reader().execute(_PENDING_COUNTS, (now,)).fetchall()
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"ledger read failed: {exc}") from exc
        return pending_counts(rows)

    # -- retention (``LedgerRetention``) ---------------------------------------------------

    def settled_before(
        self, before: float, after: SettledRow | None, limit: int
    ) -> list[SettledRow]:
        after_at, after_id = (after.settled_at, after.id) if after else (float("-inf"), "")
        try:
            rows = self._reader().execute(
                _SETTLED_PAGE, (before, before, after_at, after_id, int(limit))
            )
            return [SettledRow(*r) for r in rows.fetchall()]
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"ledger read failed: {exc}") from exc

    def prune_settled(self, ids: list[str], before: float, pruned_at: float, reason: str) -> int:
        if not ids:
            return 0
        pick = dump_json(ids)

        def op(tx: _SqliteTx) -> int:
            tx.execute(_SQL_TOMBSTONE_PRUNED, (pruned_at, reason, pick, before, before))
            tx.execute(_SQL_PRUNE_AUDIT, (pick, before, before))
            return int(tx.execute(_SQL_PRUNE_ROWS, (pick, before, before)).rowcount)

        # Not durable: a prune lost to power loss loses its tombstones with it and brings the
        # rows back whole; the next run prunes them again.
        return self._writer.submit(op, durable=False).result()

    def pruned(self, row_id: str) -> PrunedRow | None:
        try:
            found = (
                self._reader()
                .execute(
                    f"SELECT {TOMBSTONE_COLUMNS} FROM delivery_tombstones WHERE id = ?", (row_id,)
                )
                .fetchone()
            )
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"ledger read failed: {exc}") from exc
        return None if found is None else PrunedRow(*found)

    def prune_tombstones(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        pick = "SELECT id FROM delivery_tombstones WHERE pruned_at < ? ORDER BY pruned_at LIMIT ?"
        if dry_run:
            return len(self._scalars(pick, (before, int(limit))))

        def op(tx: _SqliteTx) -> int:
            cur = tx.execute(
                f"DELETE FROM delivery_tombstones WHERE id IN ({pick})", (before, limit)
            )
            return int(cur.rowcount)

        return self._writer.submit(op, durable=False).result()

    def take_lease(self, name: str, holder: str, now: float, ttl_seconds: float) -> bool:
        def op(tx: _SqliteTx) -> bool:
            cur = tx.execute(_SQL_TAKE_LEASE, (name, holder, now + ttl_seconds, now))
            return cur.rowcount == 1

        return self._writer.submit(op).result()

    def stats(self) -> dict[str, int]:
        return {
            "commits": self._writer.commits,
            "durable_commits": self._writer.durable_commits,
            "operations": self._writer.operations,
        }

    def close(self) -> None:
        if self._closed:
            return
        try:  # a file closed in order holds every goal in its index
            self._goals.index_now()
        except LedgerError:
            log.warning("the goals written last were left for the next open to index")
        self._closed = True
        self._writer.close()
        with self._readers_lock:
            for conn in self._readers:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            self._readers.clear()
