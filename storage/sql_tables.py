"""The connection plumbing every shared SQL store class of ``storage/`` has (hooks,
schedules, webhooks): a dialect subclass gives ``_tx`` (a write transaction) and, when its
write transaction locks out other writers, ``_snapshot``; statements are written with ``?``
and bound in the dialect's placeholder (``storage.sql.marked``)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from storage.sql import marked

__all__ = ["SqlTables"]


class SqlTables:
    """Reads, writes and placeholders over a connection that ``_tx`` opens."""

    mark = "?"  # the dialect's placeholder; PostgreSQL sets its own

    def _tx(self) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError

    def _snapshot(self) -> contextlib.AbstractContextManager[Any]:
        """A connection for reads; a dialect whose write transaction locks out other
        writers (SQLite) reads outside one."""
        return self._tx()

    def _sql(self, text: str) -> str:
        return marked(text, self.mark)

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._snapshot() as conn:
            return list(conn.execute(self._sql(sql), tuple(params)).fetchall())

    def _write(self, sql: str, params: Sequence[Any]) -> int:
        with self._tx() as conn:
            return int(conn.execute(self._sql(sql), tuple(params)).rowcount)
