"""Cross-process wake-ups of a store: the ``Notifier`` seam.

A backend owns a ``Notifier``. ``notify()`` pokes every process sharing that store (an
operator's ``redeliver`` tells the running servers to look now); ``subscribe()`` gives a
``Subscription``: a selectable file descriptor that becomes readable after a poke, which
the re-offer scheduler adds to its selector. The seam is narrow on purpose: PostgreSQL
plugs LISTEN/NOTIFY into the same two calls (its subscription's fd is the connection's
socket).

The forms live with the storage that pokes: ``storage.sqlite.notifier`` (a directory of
unix sockets beside a SQLite file), ``storage.postgres.notifier`` (LISTEN/NOTIFY) and
``storage.pokes`` (within one process).
"""

from __future__ import annotations

from typing import Protocol


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
