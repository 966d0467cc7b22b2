"""Helpers shared by the ledger tests: the backends, a fake clock, identities of processes."""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from delivery.backend import LedgerBackend
from delivery.identity import ProcessIdentity, current_identity, process_start_ticks
from delivery.ledger import Ledger
from tests.pg_support import fresh_url
from tests.stores import memory_ledger, pg_ledger, sqlite_ledger

T0 = 1_700_000_000.0

BACKENDS = ("sqlite", "memory", "postgres")


def make_backend(kind: str, directory: Path) -> LedgerBackend:
    if kind == "sqlite":
        return sqlite_ledger(directory / "ledger.db")
    if kind == "memory":
        return memory_ledger()
    if kind == "postgres":
        return pg_ledger(fresh_url())
    raise AssertionError(f"unknown backend {kind!r}")


# An identity on another host: nothing can prove it dead, so only its lease decides.
REMOTE_IDENTITY = "elsewhere.example|00000000-boot|4242|99"


class FakeClock:
    """A clock the test moves by hand; the ledger reads it through ``clock=`` (the wall
    clock) and ``monotonic=`` (``clock.monotonic``: time that really passed).

    ``advance`` is time passing (both move); ``step`` is the wall clock being stepped (NTP,
    ``date -s``) while no time passes (only the wall clock moves).
    """

    def __init__(self, start: float = T0) -> None:
        self._now = start
        self._mono = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> float:
        with self._lock:
            self._now += seconds
            self._mono += seconds
            return self._now

    def step(self, seconds: float) -> float:
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, when: float) -> None:
        with self._lock:
            self._now = when


def identity_of(pid: int) -> ProcessIdentity:
    """The ledger identity of another local process (same host and boot as this one)."""
    me = current_identity()
    ticks = process_start_ticks(pid)
    assert ticks is not None, f"process {pid} is not running"
    return ProcessIdentity(me.host, me.boot_id, pid, ticks)


def start_idle_child() -> subprocess.Popen[bytes]:
    """A real process that lives until its stdin is closed."""
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )


def stop_child(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    proc.wait(timeout=10)


@functools.cache
def exited_identity() -> str:
    """The identity of a real local process that has exited (and been reaped)."""
    proc = start_idle_child()
    ident = identity_of(proc.pid)
    stop_child(proc)
    assert ident.is_known_dead()
    return str(ident)


def delegation_event(row_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "async_delegation",
        "delegation_id": row_id,
        "status": "completed",
        "summary": f"result of {row_id}",
        **extra,
    }


def finished_row(ledger: Ledger, row_id: str, **event_extra: Any) -> dict[str, Any]:
    """Create a running row and finish it: a pending completion with an event."""
    ledger.create(row_id, kind="delegation", state="running", session_key="sess")
    event = delegation_event(row_id, **event_extra)
    assert ledger.finish(row_id, expected="running", state="completed", event=event)
    return event
