"""A SQLite store on one connection under a lock: the small stores whose rows are few and
each write small (the ledger's side stores, the chat platforms' state). The file is created
private and its DDL applied on open; each write is its own ``BEGIN IMMEDIATE`` transaction,
so every process sharing the file sees it at once (queued behind the file's other writers by
its ``WriteLock``); no group-commit writer."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator

from storage.sqlite import files as sqlite_files
from storage.sqlite.write_lock import WriteLock

__all__ = ["OneConnectionStore"]


class OneConnectionStore:
    """``_tx`` (one write transaction), ``_snapshot`` (a plain read, beside other writers
    thanks to WAL) and ``close``; a closed store raises ``closed_error``."""

    what = "store"  # names the store in errors ("the webhook store is closed")

    def __init__(
        self, file: sqlite_files.SqliteFile, ddl: str, closed_error: type[Exception]
    ) -> None:
        self._file = file
        self._closed_error = closed_error
        self.path = file.path
        sqlite_files.create_private(file)
        conn = sqlite_files.connect(file, check_owner=True)
        try:
            sqlite_files.stamp_schema(conn, file, ddl)
        except BaseException:
            conn.close()
            raise
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.Lock()
        self._write_lock = WriteLock(file.path)  # used under ``_lock``: one holder at a time

    def _open_conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise self._closed_error(f"the {self.what} is closed")
        return self._conn

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._open_conn()
            with self._write_lock, sqlite_files.immediate(conn, self._file):
                yield conn

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._open_conn()
            try:
                yield conn
            except sqlite3.Error as exc:
                raise sqlite_files.classify(exc, self._file, "read") from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                self._write_lock.close()
