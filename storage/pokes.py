"""Pokes within one process, and the socket subscription every local form of the
``delivery.notifier.Notifier`` seam hands out.

``LocalNotifier``: a store nobody else can share (the memory dialect), or the fan-out of
one process's listener (PostgreSQL's LISTEN connection pokes its local subscribers through
one): a socket pair per subscriber. ``SocketSubscription``: one datagram socket, readable
after a poke; the SQLite dialect's subscriptions are bound to files.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading

from delivery.notifier import Subscription

__all__ = ["LocalNotifier", "SocketSubscription"]


class SocketSubscription:
    """One datagram socket; ``path`` (when bound to a file) is removed on close."""

    def __init__(self, sock: socket.socket, path: str | None = None) -> None:
        sock.setblocking(False)  # drain() reads until EAGAIN
        self._sock = sock
        self._path = path

    def fileno(self) -> int:
        return self._sock.fileno()

    def drain(self) -> None:
        with contextlib.suppress(OSError):
            while self._sock.recv(64):
                pass

    def close(self) -> None:
        self._sock.close()
        if self._path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._path)


class _PairSubscription(SocketSubscription):
    def __init__(self, owner: LocalNotifier) -> None:
        reader, self.writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.writer.setblocking(False)
        super().__init__(reader)
        self._owner = owner

    def close(self) -> None:
        self._owner._forget(self)
        super().close()
        self.writer.close()


class LocalNotifier:
    """Pokes within one process (a store nobody else can share)."""

    def __init__(self) -> None:
        self._subs: list[_PairSubscription] = []
        self._lock = threading.Lock()

    def notify(self) -> int:
        with self._lock:
            subs = list(self._subs)
        for sub in subs:
            with contextlib.suppress(OSError):
                sub.writer.send(b"x")
        return len(subs)

    def subscribe(self) -> Subscription | None:
        sub = _PairSubscription(self)
        with self._lock:
            self._subs.append(sub)
        return sub

    def _forget(self, sub: _PairSubscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)
