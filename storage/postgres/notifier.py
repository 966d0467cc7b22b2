"""Wake-ups across processes and hosts through PostgreSQL ``LISTEN/NOTIFY``.

``notify()`` is one ``pg_notify`` on the store's channel (one channel per schema). Every
process keeps ONE dedicated listening connection, run by a thread that selects on its
socket; each notification pokes every local ``Subscription`` (a socket pair, so the fd a
scheduler selects on never changes). When the connection breaks the thread reconnects by
itself, with a growing pause, and pokes every subscriber once it listens again: a
notification sent while it was away may have been missed, so the schedulers look now.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
from typing import Any

import psycopg

from delivery.notifier import Subscription
from storage.pokes import LocalNotifier
from storage.postgres.conn import connect, redact

log = logging.getLogger(__name__)

_MAX_PAUSE = 5.0


def channel_for(schema: str) -> str:
    """The NOTIFY channel of the store in ``schema`` (an identifier, quoted by callers)."""
    return f"reveille_wake_{schema}"[:63]


class PostgresNotifier:
    """``Notifier`` of a PostgreSQL store; see the module docstring."""

    def __init__(self, url: str, channel: str, pool: Any) -> None:
        self._url = url
        self.channel = channel
        self._pool = pool
        self._local = LocalNotifier()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._stop_r, self._stop_w = socket.socketpair()
        self._stop_w.setblocking(False)
        self.reconnects = 0
        self.received = 0

    def notify(self) -> int:
        for attempt in (1, 2):
            try:
                with self._pool.connection() as conn:
                    conn.execute("SELECT pg_notify(%s, '')", (self.channel,))
                return 1
            except psycopg.OperationalError as exc:
                # The pool hands connections out unchecked: one the server dropped (a
                # restart) is found here; the pool checks the rest and it goes once more.
                if attempt == 2:
                    log.warning("could not notify the other servers: %s", exc)
                    return 0
                with contextlib.suppress(psycopg.Error):
                    self._pool.check()
            except psycopg.Error as exc:
                log.warning("could not notify the other servers: %s", exc)
                return 0
        return 0

    def subscribe(self) -> Subscription | None:
        sub = self._local.subscribe()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pg-listen", daemon=True)
                self._thread.start()
        # A subscriber hears every notification sent after subscribe() returns.
        if not self._listening.wait(10):
            log.warning("LISTEN on %s is not up yet; wake-ups start once it is", self.channel)
        return sub

    def wait_listening(self, timeout: float) -> bool:
        """True once the listening connection is up (tests, start-up)."""
        return self._listening.wait(timeout)

    def break_connection(self) -> None:
        """Close the listening connection under the thread (tests of reconnection)."""
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._stop_w.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._stop_r.close()
        self._stop_w.close()

    # -- the listening thread ----------------------------------------------------------------

    def _run(self) -> None:
        pause = 0.1
        while not self._stop.is_set():
            try:
                self._listen()
                pause = 0.1
            except Exception as exc:
                if self._stop.is_set():
                    break
                self.reconnects += 1
                log.warning(
                    "LISTEN connection to %s lost (%s); reconnecting in %.1f s",
                    redact(self._url),
                    " ".join(str(exc).split()) or type(exc).__name__,
                    pause,
                )
                self._stop.wait(pause)
                pause = min(pause * 2, _MAX_PAUSE)

    def _listen(self) -> None:
        conn = connect(self._url)
        self._conn = conn
        try:
            conn.execute(f'LISTEN "{self.channel}"')
            if self._listening.is_set() or self.reconnects:
                self._local.notify()  # anything sent while we were away: look now
            self._listening.set()
            with selectors.DefaultSelector() as sel:
                sel.register(conn.fileno(), selectors.EVENT_READ)
                sel.register(self._stop_r, selectors.EVENT_READ)
                while not self._stop.is_set():
                    ready = sel.select(timeout=30.0)
                    if self._stop.is_set():
                        return
                    if not ready:
                        conn.execute("SELECT 1")  # notices a dead server on a quiet socket
                    got = False
                    for _ in conn.notifies(timeout=0):
                        got = True
                        self.received += 1
                    if got:
                        self._local.notify()
                    if conn.closed:
                        raise psycopg.OperationalError("the connection was closed")
        finally:
            self._conn = None
            with contextlib.suppress(Exception):
                conn.close()
