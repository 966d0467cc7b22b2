"""The Responses API's tables in one SQLite file (``responses.db`` beside the ledger).

WAL, 0600, opened through ``storage.sqlite.files`` with its own ``user_version`` (2: the
``caller`` column, added to a version 1 file when it is opened).
``synchronous=FULL``: a response row is written before its work starts and must survive a
crash. One connection, one statement at a time; every write is a ``BEGIN IMMEDIATE``
transaction (queued behind the file's other writers by its ``WriteLock``), so servers
sharing the file draw event numbers one after the other. The
processes sharing it poke each other through unix sockets in ``responses.db.wake.d/``.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from delivery.responses_backend import ResponsesBackend
from storage.responses_sql import DDL, ResponsesSql, add_sqlite_columns
from storage.sqlite.files import (
    PLACEHOLDER,
    FileErrors,
    SqliteFile,
    classify,
    connect,
    create_private,
    stamp_schema,
)
from storage.sqlite.notifier import SocketDirNotifier, wake_dir_for
from storage.sqlite.write_lock import WriteLock

__all__ = ["ResponsesStoreError", "SqliteResponses"]

_APPLICATION_ID = 0x52525350  # "RRSP"
SCHEMA_VERSION = 2


class ResponsesStoreError(Exception):
    """The responses file cannot be used (not ours, locked, unwritable)."""


class SqliteResponses(ResponsesSql):
    """``ResponsesBackend`` over one SQLite file (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.spec = SqliteFile(
            str(path),
            "responses store",
            _APPLICATION_ID,
            SCHEMA_VERSION,
            FileErrors(ResponsesStoreError, ResponsesStoreError),
        )
        create_private(self.spec)
        conn = connect(self.spec, check_owner=True)
        try:
            stamp_schema(conn, self.spec, DDL)
            add_sqlite_columns(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise classify(exc, self.spec, "use") from exc
        except BaseException:
            conn.close()
            raise
        self._conn: sqlite3.Connection | None = conn
        self._guard = threading.Lock()
        self._write_lock = WriteLock(self.spec.path)  # used under ``_guard``
        super().__init__(
            PLACEHOLDER,
            self._transaction,
            lock="",
            notifier=SocketDirNotifier(wake_dir_for(str(path))),
            close=self._close_conn,
            read=self._snapshot,
        )

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._guard:
            if self._conn is None:
                raise ResponsesStoreError("the responses store is closed")
            conn = self._conn
            with self._write_lock:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    yield conn
                    conn.execute("COMMIT")
                except sqlite3.Error as exc:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise classify(exc, self.spec, "use") from exc
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        # A plain read: WAL lets it run beside a writer in another process instead of
        # queueing for the write lock as BEGIN IMMEDIATE would.
        with self._guard:
            if self._conn is None:
                raise ResponsesStoreError("the responses store is closed")
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise classify(exc, self.spec, "read") from exc

    def _close_conn(self) -> None:
        with self._guard:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                self._write_lock.close()


if TYPE_CHECKING:
    _conforms: type[ResponsesBackend] = SqliteResponses
