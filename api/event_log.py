"""The web UI's durable event log: every event of the browser's stream, with an increasing id.

The log is one SQLite file (``webui.db`` under ``REVEILLE_HOME``; WAL, 0600, opened through
``storage.sqlite.files``), shared by every server on that state directory. Writes run on one
worker thread of their own, in order, never on the event loop. Events reach the live
subscribers (one bounded queue per open stream) in id order, whichever server appended
them: an append pokes the other servers (``delivery.notifier``'s socket directory beside
the file), and each server's tail reads what it has not published yet. SQLite hands out ids
in commit order, so a tail never skips one. ``since(id)`` replays from storage; an id older
than what is kept (the log is pruned to its newest ``keep`` events) or newer than any
written answers None, and the stream sends ``reset``. The same file keeps the durable
unread marks of sessions, the finished tool steps of turns (shown in their place in the
transcript) and the secret the login cookie is signed with.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from delivery.notifier import SocketDirNotifier, wake_dir_for
from delivery.notifier import Subscription as Pokes
from storage.sqlite.files import FileErrors, SqliteFile, connect, create_private, stamp_schema

__all__ = ["EventLog", "EventLogError", "LoggedEvent", "Subscription", "ToolStep"]

T = TypeVar("T")
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
_PRUNE_EVERY = 500
_QUEUE_BOUND = 2000
_TAIL_BATCH = 1000


class EventLogError(Exception):
    """The event log file cannot be used (not ours, locked, unwritable)."""


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """One event as the stream sends it."""

    id: int
    type: str
    data: dict[str, Any]

    def sse(self) -> bytes:
        """The event in Server-Sent-Events framing (JSON data: never live HTML)."""
        payload = json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))
        return f"id: {self.id}\nevent: {self.type}\ndata: {payload}\n\n".encode()


@dataclass(frozen=True, slots=True)
class ToolStep:
    """A finished tool step of a session's turn (the transcript stores only the text)."""

    id: int
    message_id: int | None
    """The reply of its turn (the step is shown right before it); None while it runs."""
    name: str
    status: str
    summary: str


@dataclass(eq=False)
class Subscription:
    """A live stream's queue; ``None`` in it means "end now" (overflow, too many tabs of its
    owner, or shutdown). ``owner`` is who opened it (a login, or a client address)."""

    owner: str = ""
    queue: asyncio.Queue[LoggedEvent | None] = field(
        default_factory=lambda: asyncio.Queue(_QUEUE_BOUND)
    )


class TooManyStreams(Exception):
    """Every stream the server allows is open: the caller answers 429 with Retry-After."""


class EventLog:
    """Append, replay and publish web UI events; keep unread marks (see the module docstring)."""

    def __init__(
        self,
        path: str | Path,
        *,
        keep: int = 20000,
        max_streams: int = 256,
        max_streams_per_owner: int = 32,
    ) -> None:
        self.spec = SqliteFile(
            str(path),
            "web UI event log",
            _APPLICATION_ID,
            _SCHEMA_VERSION,
            FileErrors(EventLogError, EventLogError),
            synchronous="NORMAL",
        )
        self.keep = keep
        self._conn: sqlite3.Connection | None = None
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="webui-event-log")
        # Bounds on open streams: each holds a connection and a queue, so an unbounded number
        # would let one client exhaust the server's descriptors.
        self.max_streams = max_streams
        self.max_streams_per_owner = max_streams_per_owner
        # Insertion-ordered (a dict as an ordered set): the oldest stream comes first.
        self._subscribers: dict[Subscription, None] = {}
        self._appended = 0
        self._notifier = SocketDirNotifier(wake_dir_for(str(path)))
        self._pokes: Pokes | None = None
        # The tail: the newest id published to this server's streams, and what wakes it.
        self._published = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._more = asyncio.Event()
        self._tail: asyncio.Task[None] | None = None
        self._watchers: list[Callable[[LoggedEvent], None]] = []

    # ----------------------------------------------------------------- lifecycle

    def open(self) -> None:
        """Create or open the file (blocking: call it off the event loop)."""
        create_private(self.spec)
        conn = connect(self.spec, check_owner=True)
        stamp_schema(conn, self.spec, _DDL)
        self._conn = conn

    async def aopen(self) -> None:
        """Open, and start publishing every server's events to this server's streams."""
        await self._run(self.open)
        self._published = await self.latest_id()
        self._loop = asyncio.get_running_loop()
        self._pokes = await self._run(self._notifier.subscribe)
        if self._pokes is not None:
            self._loop.add_reader(self._pokes.fileno(), self._poked)
        self._tail = asyncio.create_task(self._follow_tail())

    async def aclose(self) -> None:
        self._detach()
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        self._detach()
        self.end_streams()
        self._writer.shutdown(wait=True)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _detach(self) -> None:
        """Stop the tail (on the loop's thread: ``aclose``, or ``close`` called there)."""
        if self._tail is not None:
            self._tail.cancel()
            self._tail = None
        if self._pokes is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._pokes.fileno())
            self._pokes.close()
            self._pokes = None

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._writer, fn)

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise EventLogError("the web UI event log is not open")
        return self._conn

    # ----------------------------------------------------------------- events

    async def append(self, type_: str, data: dict[str, Any]) -> LoggedEvent:
        """Write the event and publish it to every live stream of every server; returns it
        with its id."""
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
        event_id = await self._run(lambda: self._insert(type_, text))
        event = LoggedEvent(event_id, type_, json.loads(text))
        if event_id == self._published + 1:
            self._publish(event)  # nothing between: no read needed
        else:
            self._more.set()  # another server's events come first: the tail reads them
        return event

    def _insert(self, type_: str, text: str) -> int:
        db = self._db()
        cur = db.execute(
            "INSERT INTO events (created_at, type, data) VALUES (?, ?, ?)",
            (time.time(), type_, text),
        )
        event_id = int(cur.lastrowid or 0)
        self._appended += 1
        if self._appended % _PRUNE_EVERY == 0:
            db.execute("DELETE FROM events WHERE id <= ?", (event_id - self.keep,))
        self._notifier.notify()  # committed (autocommit): the other servers may read it
        return event_id

    def watch(self, watcher: Callable[[LoggedEvent], None]) -> None:
        """Be told of every event this server publishes, its own and other servers' (on the
        event loop, in id order): how a server acts on what a tab asked another server."""
        self._watchers.append(watcher)

    def _publish(self, event: LoggedEvent) -> None:
        self._published = event.id
        for watcher in self._watchers:
            try:
                watcher(event)
            except Exception:
                logger.exception("a watcher of the event log failed on %s", event.type)
        for sub in list(self._subscribers):
            try:
                sub.queue.put_nowait(event)
            except asyncio.QueueFull:
                # A stream that cannot keep up ends; its tab reconnects and replays.
                self._end(sub)

    def _poked(self) -> None:
        if self._pokes is not None:
            self._pokes.drain()
        self._more.set()

    async def _follow_tail(self) -> None:
        """Publish, in id order, the events this server has not published yet (another
        server's, or ones that overtook a local append)."""
        while True:
            await self._more.wait()
            self._more.clear()
            try:
                events = await self._run(lambda: self._after(self._published))
            except Exception as exc:
                logger.warning("could not read the web UI event log: %s", exc)
                await asyncio.sleep(0.5)
                self._more.set()
                continue
            for event in events:
                if event.id > self._published:
                    self._publish(event)
            if len(events) == _TAIL_BATCH:
                self._more.set()  # more behind these

    def _after(self, after_id: int) -> list[LoggedEvent]:
        rows = self._db().execute(
            "SELECT id, type, data FROM events WHERE id > ? ORDER BY id LIMIT ?",
            (after_id, _TAIL_BATCH),
        )
        return [LoggedEvent(int(r[0]), str(r[1]), json.loads(r[2])) for r in rows]

    async def since(self, after_id: int, limit: int = 5000) -> list[LoggedEvent] | None:
        """Events after ``after_id`` in order; None when that id cannot be replayed."""
        return await self._run(lambda: self._since(after_id, limit))

    def _since(self, after_id: int, limit: int) -> list[LoggedEvent] | None:
        db = self._db()
        newest = self._latest(db)
        if after_id > newest or after_id < 0:
            return None
        oldest = db.execute("SELECT min(id) FROM events").fetchone()[0]
        if after_id < newest and (oldest is None or after_id < int(oldest) - 1):
            return None  # pruned past it
        rows = db.execute(
            "SELECT id, type, data FROM events WHERE id > ? ORDER BY id LIMIT ?",
            (after_id, limit + 1),
        ).fetchall()
        if len(rows) > limit:
            return None  # too much missed: refetching is cheaper
        return [LoggedEvent(int(r[0]), str(r[1]), json.loads(r[2])) for r in rows]

    @staticmethod
    def _latest(db: sqlite3.Connection) -> int:
        row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
        return int(row[0]) if row else 0

    async def latest_id(self) -> int:
        return await self._run(lambda: self._latest(self._db()))

    @property
    def open_streams(self) -> int:
        return len(self._subscribers)

    def subscribe(self, owner: str = "") -> Subscription:
        """A new live stream of ``owner``. An owner at its limit of open streams (a login
        with too many tabs) has its oldest stream ended to make room; with every stream of
        the server open, TooManyStreams."""
        mine = [s for s in self._subscribers if s.owner == owner]
        if len(mine) >= self.max_streams_per_owner:
            self._end(mine[0])
        elif len(self._subscribers) >= self.max_streams:
            raise TooManyStreams(f"{len(self._subscribers)} event streams are open")
        sub = Subscription(owner)
        self._subscribers[sub] = None
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.pop(sub, None)

    def end_streams(self) -> None:
        """End every live stream (shutdown): each tab reconnects and replays."""
        for sub in list(self._subscribers):
            self._end(sub)

    def _end(self, sub: Subscription) -> None:
        self._subscribers.pop(sub, None)
        while True:
            try:
                sub.queue.put_nowait(None)
                return
            except asyncio.QueueFull:
                sub.queue.get_nowait()

    # ----------------------------------------------------------------- unread marks

    async def set_unread(self, session_id: str, unread: bool) -> None:
        await self._run(
            lambda: self._db().execute(
                "INSERT INTO unread (session_id, unread) VALUES (?, ?) "
                "ON CONFLICT(session_id) DO UPDATE SET unread = excluded.unread",
                (session_id, int(unread)),
            )
        )

    async def unread_ids(self) -> set[str]:
        rows = await self._run(
            lambda: self._db().execute("SELECT session_id FROM unread WHERE unread = 1").fetchall()
        )
        return {str(r[0]) for r in rows}

    # ----------------------------------------------------------------- tool steps

    async def add_tool_step(
        self, session_id: str, turn_id: str, *, name: str, status: str, summary: str
    ) -> None:
        await self._run(
            lambda: self._db().execute(
                "INSERT INTO tool_steps (session_id, turn_id, created_at, name, status, summary)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (session_id, turn_id, time.time(), name, status, summary),
            )
        )

    async def place_tool_steps(self, turn_id: str, message_id: int | None) -> None:
        """Pin a finished turn's steps before its stored reply; None (the turn stored
        nothing) forgets them."""

        def place() -> None:
            db = self._db()
            if message_id is None:
                db.execute("DELETE FROM tool_steps WHERE turn_id = ?", (turn_id,))
            else:
                db.execute(
                    "UPDATE tool_steps SET message_id = ? WHERE turn_id = ?", (message_id, turn_id)
                )

        await self._run(place)

    async def tool_steps(self, session_id: str, limit: int = 2000) -> list[ToolStep]:
        rows = await self._run(
            lambda: (
                self._db()
                .execute(
                    "SELECT id, message_id, name, status, summary FROM tool_steps "
                    "WHERE session_id = ? ORDER BY id DESC LIMIT ?",
                    (session_id, limit),
                )
                .fetchall()
            )
        )
        steps = [
            ToolStep(
                int(r[0]), None if r[1] is None else int(r[1]), str(r[2]), str(r[3]), str(r[4])
            )
            for r in rows
        ]
        return steps[::-1]

    # ----------------------------------------------------------------- the cookie secret

    async def secret(self) -> bytes:
        """This state directory's signing secret, made once (a restart keeps logins)."""
        return await self._run(self._secret)

    async def login_epoch(self) -> int:
        """The web UI's login epoch: cookies of another epoch are logged out."""
        return await self._run(self._login_epoch)

    async def next_login_epoch(self) -> int:
        """Move the login epoch on (a logout), durably; returns the new one."""
        return await self._run(self._next_login_epoch)

    def _login_epoch(self) -> int:
        row = self._db().execute("SELECT value FROM meta WHERE name = 'login_epoch'").fetchone()
        return int(row[0]) if row is not None else 0

    def _next_login_epoch(self) -> int:
        db = self._db()
        epoch = self._login_epoch() + 1
        db.execute(
            "INSERT INTO meta (name, value) VALUES ('login_epoch', ?) "
            "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            (str(epoch),),
        )
        return epoch

    def _secret(self) -> bytes:
        db = self._db()
        db.execute(
            "INSERT OR IGNORE INTO meta (name, value) VALUES ('cookie_secret', ?)",
            (secrets.token_hex(32),),
        )
        row = db.execute("SELECT value FROM meta WHERE name = 'cookie_secret'").fetchone()
        return bytes.fromhex(str(row[0]))
