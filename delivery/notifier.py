"""Cross-process wake-ups of a ledger store: the ``Notifier`` seam and its two local forms.

A backend owns a ``Notifier``. ``notify()`` pokes every process sharing that store (an
operator's ``redeliver`` tells the running servers to look now); ``subscribe()`` gives a
``Subscription``: a selectable file descriptor that becomes readable after a poke, which
the re-offer scheduler adds to its selector. The seam is narrow on purpose: PostgreSQL
plugs LISTEN/NOTIFY into the same two calls (its subscription's fd is the connection's
socket).

- ``SocketDirNotifier``: processes on one host sharing a SQLite file. Each subscriber binds a
  unix datagram socket in a private directory beside the file; a poke is one datagram to
  each. Sockets of dead processes are removed by the next poke.
- ``LocalNotifier``: one process (the in-memory backend): a socket pair per subscriber.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import threading
from typing import Protocol

log = logging.getLogger(__name__)


class Subscription(Protocol):
    def fileno(self) -> int:
        """Readable after a poke, until ``drain()``."""

    def drain(self) -> None:
        """Consume the pending pokes (never blocks)."""

    def close(self) -> None: ...


class Notifier(Protocol):
    def notify(self) -> int:
        """Poke every subscriber of this store; returns how many were reached (best effort)."""

    def subscribe(self) -> Subscription | None:
        """A new subscription, or None when this store cannot deliver pokes here."""


class _SocketSubscription:
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


def wake_dir_for(path: str) -> str:
    """Where the subscribers of processes sharing the file ``path`` bind their sockets."""
    return path + ".wake.d"


def poke_dir(wake_dir: str) -> int:
    """One datagram to every socket in ``wake_dir``; returns how many were reached."""
    reached = 0
    try:
        names = os.listdir(wake_dir)
    except OSError:
        return 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        for name in names:
            path = os.path.join(wake_dir, name)
            try:
                sock.sendto(b"x", path)
                reached += 1
            except (ConnectionRefusedError, FileNotFoundError):
                with contextlib.suppress(OSError):
                    os.unlink(path)  # its process is gone
            except OSError:
                pass  # a full socket buffer: that subscriber has pokes pending already
    return reached


class SocketDirNotifier:
    """Pokes between processes on one host, through a directory of unix sockets."""

    def __init__(self, wake_dir: str) -> None:
        self.wake_dir = wake_dir

    def notify(self) -> int:
        return poke_dir(self.wake_dir)

    def subscribe(self) -> Subscription | None:
        try:
            os.makedirs(self.wake_dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            log.warning("no cross-process wake-ups: %s", exc)
            return None
        path = os.path.join(self.wake_dir, f"{os.getpid()}-{secrets.token_hex(4)}.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(path)
        except OSError as exc:  # e.g. a path longer than a socket address allows
            log.warning("no cross-process wake-ups: %s", exc)
            sock.close()
            return None
        return _SocketSubscription(sock, path)


class _PairSubscription(_SocketSubscription):
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
