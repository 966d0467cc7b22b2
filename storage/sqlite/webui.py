"""The web UI's state in one SQLite file (``webui.db`` beside the ledger): its event log,
unread marks, finished tool steps and settings (``delivery.webui_state``).

WAL, 0600, opened through ``storage.sqlite.files``; ``synchronous=NORMAL`` (an event lost to
power loss is replayed as a reset by the tab, nothing owed is in this file). SQLite takes
one writer at a time and an id is handed out inside its writer's transaction, so ids grow
in commit order whichever process appends. The processes sharing the file poke each other
through unix sockets in ``webui.db.wake.d/``.

A file deleted (or replaced) while the server runs is noticed at the next use: the open
connection would go on writing to the unlinked file, lost to every tab and to the next
start. The backend says so once (a warning: the tabs reset, and logins end with the
cookie secret the file held) and makes the file again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from delivery.notifier import Notifier
from delivery.webui_state import StoredEvent, ToolStep, WebUIStateBackend
from storage.sqlite.files import FileErrors, SqliteFile, connect, create_private, stamp_schema
from storage.sqlite.notifier import SocketDirNotifier, wake_dir_for
from storage.sqlite.write_lock import WriteLock

__all__ = ["SqliteWebUIState", "WebUIStateError"]

logger = logging.getLogger(__name__)

_APPLICATION_ID = 0x52574C47  # "RWLG"
_SCHEMA_VERSION = 1
_DDL = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at REAL NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS unread (
    session_id TEXT PRIMARY KEY,
    unread INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tool_steps (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    message_id INTEGER,
    created_at REAL NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    summary TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_tool_steps_session ON tool_steps(session_id, id);
CREATE TABLE IF NOT EXISTS meta (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
)
"""


class WebUIStateError(Exception):
    """The web UI's state cannot be used (not ours, locked, unwritable)."""


class SqliteWebUIState:
    """``WebUIStateBackend`` over one SQLite file (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.spec = SqliteFile(
            str(path),
            "web UI state",
            _APPLICATION_ID,
            _SCHEMA_VERSION,
            FileErrors(WebUIStateError, WebUIStateError),
            synchronous="NORMAL",
        )
        self._notifier = SocketDirNotifier(wake_dir_for(str(path)))
        self._lock = threading.Lock()  # one statement at a time on the one connection
        self._conn: sqlite3.Connection | None = None
        self._file: tuple[int, int] | None = None
        self._closed = False
        self._open()
        # Writes queue behind the other processes' writes to the file (``_writing``).
        self._write_lock = WriteLock(self.spec.path)

    def _open(self) -> None:
        create_private(self.spec)
        conn = connect(self.spec, check_owner=True)
        try:
            stamp_schema(conn, self.spec, _DDL)
            self._file = _identity(self.spec.path)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    @property
    def notifier(self) -> Notifier:
        return self._notifier

    def _db(self) -> sqlite3.Connection:
        """The connection (the caller holds the lock), to the file that is there now."""
        if self._closed:
            raise WebUIStateError("the web UI state is closed")
        if self._conn is None or _identity(self.spec.path) != self._file:
            if self._conn is not None:
                logger.warning(
                    "%s was deleted or replaced while the server ran; made again (open "
                    "tabs reload, and logins end: the file held the cookie secret)",
                    self.spec.path,
                )
                self._conn.close()
                self._conn = None
            try:
                self._open()
            except Exception as exc:  # tried again at the next use
                raise WebUIStateError(
                    f"{self.spec.path} is gone and cannot be made again: {exc}"
                ) from None
        assert self._conn is not None
        return self._conn

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._write_lock.close()
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """The lock for a statement that writes (it is its own transaction): this process's
        lock, then the file's write lock shared with every other process."""
        with self._lock, self._write_lock:
            yield

    # -- the event log

    def append_event(self, type_: str, data_json: str, created_at: float) -> int:
        with self._writing():
            cur = self._db().execute(
                "INSERT INTO events (created_at, type, data) VALUES (?, ?, ?)",
                (created_at, type_, data_json),
            )
            return int(cur.lastrowid or 0)

    def events_after(self, after_id: int, limit: int) -> list[StoredEvent]:
        with self._lock:
            rows = self._db().execute(
                "SELECT id, type, data FROM events WHERE id > ? ORDER BY id LIMIT ?",
                (after_id, limit),
            )
            return [StoredEvent(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def oldest_event_id(self) -> int | None:
        with self._lock:
            row = self._db().execute("SELECT min(id) FROM events").fetchone()
        return None if row[0] is None else int(row[0])

    def newest_event_id(self) -> int:
        with self._lock:
            row = (
                self._db()
                .execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'")
                .fetchone()
            )
        return int(row[0]) if row else 0

    def prune_events(self, keep: int) -> None:
        newest = self.newest_event_id()
        with self._writing():
            self._db().execute("DELETE FROM events WHERE id <= ?", (newest - keep,))

    def prune_events_before(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        # In id order: the old events are the first ids, so no index on created_at is needed.
        pick = "SELECT id FROM events WHERE created_at < ? ORDER BY id LIMIT ?"
        with self._writing():
            if dry_run:
                return len(self._db().execute(pick, (before, int(limit))).fetchall())
            cur = self._db().execute(f"DELETE FROM events WHERE id IN ({pick})", (before, limit))
            return int(cur.rowcount)

    # -- unread marks

    def set_unread(self, session_id: str, unread: bool) -> None:
        with self._writing():
            self._db().execute(
                "INSERT INTO unread (session_id, unread) VALUES (?, ?) "
                "ON CONFLICT(session_id) DO UPDATE SET unread = excluded.unread",
                (session_id, int(unread)),
            )

    def unread_ids(self) -> set[str]:
        with self._lock:
            rows = self._db().execute("SELECT session_id FROM unread WHERE unread = 1")
            return {str(r[0]) for r in rows}

    # -- finished tool steps

    def add_tool_step(
        self, session_id: str, turn_id: str, name: str, status: str, summary: str, at: float
    ) -> None:
        with self._writing():
            self._db().execute(
                "INSERT INTO tool_steps (session_id, turn_id, created_at, name, status, summary)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (session_id, turn_id, at, name, status, summary),
            )

    def place_tool_steps(self, turn_id: str, message_id: int | None) -> None:
        with self._writing():
            if message_id is None:
                self._db().execute("DELETE FROM tool_steps WHERE turn_id = ?", (turn_id,))
            else:
                self._db().execute(
                    "UPDATE tool_steps SET message_id = ? WHERE turn_id = ?", (message_id, turn_id)
                )

    def tool_steps(self, session_id: str, limit: int) -> list[ToolStep]:
        with self._lock:
            rows = (
                self._db()
                .execute(
                    "SELECT id, message_id, name, status, summary FROM tool_steps "
                    "WHERE session_id = ? ORDER BY id DESC LIMIT ?",
                    (session_id, limit),
                )
                .fetchall()
            )
        return [ToolStep.of_row(r) for r in reversed(rows)]

    # -- settings

    def setting(self, name: str) -> str | None:
        with self._lock:
            row = self._db().execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return None if row is None else str(row[0])

    def set_setting(self, name: str, value: str) -> None:
        with self._writing():
            self._db().execute(
                "INSERT INTO meta (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (name, value),
            )

    def setting_or_default(self, name: str, default: str) -> str:
        with self._writing():
            self._db().execute(
                "INSERT OR IGNORE INTO meta (name, value) VALUES (?, ?)", (name, default)
            )
        value = self.setting(name)
        assert value is not None
        return value


# mypy proves the backend keeps the protocol, without importing it at run time.
if TYPE_CHECKING:
    _conforms: type[WebUIStateBackend] = SqliteWebUIState


def _identity(path: str) -> tuple[int, int] | None:
    """The file's device and inode (None: no file): what tells a deleted or replaced one."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)
