"""Wake-ups between processes on one host that share a SQLite file.

``SocketDirNotifier``: each subscriber binds a unix datagram socket in a private directory
beside the file (``wake_dir_for``); a poke is one datagram to each (``poke_dir``). Sockets
of dead processes are removed by the next poke.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket

from delivery.notifier import Subscription
from storage.pokes import SocketSubscription

__all__ = ["SocketDirNotifier", "poke_dir", "wake_dir_for"]

log = logging.getLogger(__name__)


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
        return SocketSubscription(sock, path)
