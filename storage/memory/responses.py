"""The Responses API's tables in this process's memory, for tests and embedding.

A private in-memory SQLite database behind the same SQL as the file and PostgreSQL stores
(``storage.responses_sql``), so the three dialects cannot drift apart; nobody else can share
it, so its pokes stay in this process (``LocalNotifier``).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from delivery.responses_backend import ResponsesBackend
from storage.pokes import LocalNotifier
from storage.responses_sql import DDL, ResponsesSql, add_sqlite_columns

__all__ = ["MemoryResponses"]


_MARK = "?"  # the shared SQL runs on an in-memory sqlite3 database


class MemoryResponses(ResponsesSql):
    """``ResponsesBackend`` in memory (see the module docstring)."""

    def __init__(self) -> None:
        self._conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self._conn.executescript(DDL)
        add_sqlite_columns(self._conn)
        self._guard = threading.Lock()
        super().__init__(
            _MARK, self._transaction, lock="", notifier=LocalNotifier(), close=lambda: None
        )

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._guard:
            self._conn.execute("BEGIN")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")


if TYPE_CHECKING:
    _conforms: type[ResponsesBackend] = MemoryResponses
