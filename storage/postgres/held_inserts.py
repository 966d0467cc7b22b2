"""New sessions and messages held back on a PostgreSQL write's connection, to go to the
server as one statement: a turn that creates its conversation writes its session's row and
its messages, and a batch of such turns (``storage.postgres.session_batches``) writes n of
each. Sent one statement each, every one costs psycopg's Python (under the GIL the event loop
shares) and the server a statement's overhead; held and sent together they cost one.

Nobody reads these inserts' answers, so holding them changes no answer: the rows
(``storage.postgres.sessions.PostgresRows``) send what is held before any other statement
they run, so the server sees every statement in the order the rules made them, except that
consecutive inserts are one statement. The sessions go first, as a data-modifying WITH,
and only while no message is held (a session after a message sends the held ones first):
the messages' foreign key is checked at the end of the statement, when the sessions of the
same statement are there, as they would be after separate statements. Rows are added in
order, so message ids are drawn in the order they were written.
"""

from __future__ import annotations

import functools
from typing import Any

import psycopg

from storage.postgres.conn import PLACEHOLDER
from storage.session_sql import insert_messages_sql, insert_sessions_sql

__all__ = ["MAX_ROWS", "HeldInserts"]

MAX_ROWS = 64  # rows of one table in one statement: a batch's worth, and few statement shapes


@functools.lru_cache(maxsize=256)
def _statement(sessions: int, messages: int) -> str:
    if not messages:
        return insert_sessions_sql(sessions, PLACEHOLDER)
    insert = insert_messages_sql(messages, PLACEHOLDER)
    if not sessions:
        return insert
    return f"WITH new_sessions AS ({insert_sessions_sql(sessions, PLACEHOLDER)}) {insert}"


class HeldInserts:
    """The inserts held on one connection (see the module docstring)."""

    __slots__ = ("_conn", "_message_values", "_messages", "_session_values", "_sessions")

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._sessions = 0
        self._messages = 0
        self._session_values: list[Any] = []
        self._message_values: list[Any] = []

    def __bool__(self) -> bool:
        return bool(self._sessions or self._messages)

    def session(self, values: tuple[Any, ...]) -> None:
        if self._messages or self._sessions >= MAX_ROWS:
            self.send()  # a session after a message: what is held goes first
        self._session_values.extend(values)
        self._sessions += 1

    def messages(self, count: int, values: list[Any]) -> None:
        """``count`` messages (``count <= MAX_ROWS``), their values one after the other."""
        if self._messages + count > MAX_ROWS:
            self.send()
        self._message_values.extend(values)
        self._messages += count

    def send(self) -> None:
        """Sends what is held as one statement (in a pipeline: queued, its answer unread)."""
        if not self:
            return
        query = _statement(self._sessions, self._messages)
        params = self._session_values + self._message_values
        self._sessions = self._messages = 0
        self._session_values = []
        self._message_values = []
        self._conn.execute(query, params)
