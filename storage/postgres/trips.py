"""Counting the round trips the PostgreSQL stores make, for the benchmarks.

With ``REVEILLE_PG_TRIPS_DIR`` set, every connection the stores open (``storage.postgres.conn``)
is a ``CountingConnection``: each wait on the server outside a pipeline counts one round trip;
in a pipeline only the waits that send a sync or a flush and read answers back count (the
statements queued before one travel with it). A daemon thread writes the process's running
total to a file named by its pid in that directory ten times a second, so
``bench/api_server.py --store postgresql`` can divide the trips made during its measurement
by the turns served. Unset (always, outside a
benchmark), the stores use psycopg's own connection class and nothing is counted.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg.abc import PQGen

RV = TypeVar("RV")

ENV = "REVEILLE_PG_TRIPS_DIR"
_counter = itertools.count()  # next() is atomic under the GIL: no lock on the hot path
_started = threading.Lock()
_writer: list[threading.Thread] = []


def _bump() -> None:
    next(_counter)


# The pipeline's steps that wait for the server (psycopg.Pipeline: sync, exit, a cursor's
# fetch); its other waits only queue statements or enter the mode.
_PIPELINE_TRIPS = frozenset({"_sync_gen", "_exit_gen", "_fetch_gen"})
# What the pool's ``with conn`` runs as it hands a connection back: nothing to send when no
# transaction is open (autocommit).
_NO_TRIP_WHEN_IDLE = frozenset({"_commit_gen", "_rollback_gen"})
_IDLE = psycopg.pq.TransactionStatus.IDLE


class CountingConnection(psycopg.Connection[Any]):
    """A psycopg connection that counts its round trips (see the module docstring)."""

    def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        name = getattr(gen, "__name__", "")
        if self._pipeline is not None:
            if name in _PIPELINE_TRIPS:
                _bump()
        elif name not in _NO_TRIP_WHEN_IDLE or self.pgconn.transaction_status != _IDLE:
            _bump()
        return super().wait(gen, interval=interval, timeout=timeout)


def total() -> int:
    """Round trips counted so far in this process (the counter is read by copying it)."""
    return int(repr(_counter)[6:-1])


def _write_forever(path: Path) -> None:
    while True:
        try:
            path.with_suffix(".tmp").write_text(str(total()))
            path.with_suffix(".tmp").replace(path)  # a reader never sees half a number
        except OSError:
            return  # the benchmark's directory is gone: nobody reads the count any more
        time.sleep(0.1)


def connection_class() -> type[psycopg.Connection[Any]]:
    """The class to open the stores' connections with: counting when the benchmark asks."""
    where = os.environ.get(ENV)
    if not where:
        return psycopg.Connection
    with _started:
        if not _writer:
            path = Path(where) / f"{os.getpid()}.trips"
            thread = threading.Thread(
                target=_write_forever, args=(path,), name="pg-trips", daemon=True
            )
            thread.start()
            _writer.append(thread)
    return CountingConnection
