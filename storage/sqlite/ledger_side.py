"""A small store of its own tables in ``ledger.db``, beside the ledger: the webhook store,
the inbound-event store.

The file is opened with the ledger's marks (created private: secrets live in it) and the
store's DDL is applied on open (``CREATE ... IF NOT EXISTS``), so whichever of the ledger
and its side stores opens a file first, it gains every table. Their rows are few and each
write small: one connection under a lock, each write its own ``BEGIN IMMEDIATE``
transaction (every process sharing the file sees it at once), no group-commit writer.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator

from delivery.errors import LedgerUnavailable
from storage.sqlite import files as sqlite_files
from storage.sqlite.ledger import _FILE_ERRORS, _SCHEMA, APPLICATION_ID, SCHEMA_VERSION

__all__ = ["LedgerSideStore"]


class LedgerSideStore:
    """The connection of a side store: ``_tx`` (one write transaction), ``_snapshot`` (a
    plain read, beside the ledger's writer thanks to WAL) and ``close``."""

    what = "side store"  # names the store in errors ("the webhook store is closed")

    def __init__(
        self, path: str | os.PathLike[str], *, ddl: str = "", busy_timeout_ms: int = 5000
    ) -> None:
        self._file = sqlite_files.SqliteFile(
            str(path),
            name="ledger",
            application_id=APPLICATION_ID,
            schema_version=SCHEMA_VERSION,
            errors=_FILE_ERRORS,
            busy_timeout_ms=busy_timeout_ms,
        )
        self.path = self._file.path
        sqlite_files.create_private(self._file)
        conn = sqlite_files.connect(self._file, check_owner=True)
        try:
            sqlite_files.stamp_schema(conn, self._file, _SCHEMA + ddl)
        except BaseException:
            conn.close()
            raise
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise LedgerUnavailable(f"the {self.what} is closed")
            with sqlite_files.immediate(conn, self._file):
                yield conn

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None:
                raise LedgerUnavailable(f"the {self.what} is closed")
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise sqlite_files.classify(exc, self._file, "read") from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
