"""Who owns a row: a process identity that survives pid reuse and reboots.

An identity is ``host|boot_id|pid|start_ticks``. On the same host and boot, a process is
alive only if ``/proc/<pid>/stat`` still shows the same start time, so a recycled pid never
keeps a dead owner's claim alive. For another host the pid says nothing: a server there
renews a heartbeat in the store, and one whose heartbeat lapsed counts as dead
(``holder_is_dead(..., lapsed)``); for any other process of another host the lease decides.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Collection
from dataclasses import dataclass


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return "unknown-boot"


def process_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] == b"Z":
        return None  # a zombie has exited; only its exit status is left
    return int(fields[19])


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    host: str
    boot_id: str
    pid: int
    start_ticks: int

    def __str__(self) -> str:
        return f"{self.host}|{self.boot_id}|{self.pid}|{self.start_ticks}"

    @classmethod
    def parse(cls, text: str) -> ProcessIdentity | None:
        try:
            host, boot_id, pid, ticks = text.rsplit("|", 3)
            return cls(host, boot_id, int(pid), int(ticks))
        except (ValueError, AttributeError):
            return None

    def is_local(self) -> bool:
        me = current_identity()
        return self.host == me.host and self.boot_id == me.boot_id

    def is_known_dead(self) -> bool:
        """True only when this host can prove the process is gone."""
        if not self.is_local():
            return False
        return process_start_ticks(self.pid) != self.start_ticks


@functools.cache
def _identity_for(pid: int) -> ProcessIdentity:
    return ProcessIdentity(socket.gethostname(), _boot_id(), pid, process_start_ticks(pid) or 0)


def current_identity() -> ProcessIdentity:
    # Keyed by pid so that a forked child gets its own identity.
    return _identity_for(os.getpid())


def holder_is_dead(holder: str | None, lapsed: Collection[str] = ()) -> bool:
    """True when ``holder`` is provably gone: a process of this host that exited, or one of
    ``lapsed``, the servers of other hosts whose heartbeat lapsed (``Ledger`` keeps that set
    from the store's server records)."""
    if not holder:
        return False
    if holder in lapsed:
        return True
    ident = ProcessIdentity.parse(holder)
    return ident is not None and ident.is_known_dead()
