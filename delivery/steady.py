"""A wall clock that a step of the system clock cannot move forward: the replay age cap's.

The ledger stamps rows with wall-clock time (``time.time``), which is what several
processes and hosts sharing a store can agree on. But the wall clock can be stepped: NTP
correcting a bad RTC, a VM resumed from a snapshot, an operator's ``date -s``. Stepped
forward by 49 h, ``now - completed_at`` says that a seconds-old result is 49 h old, and the
48 h replay cap would drop it.

``SteadyWall`` is the wall time this process read when it started, advanced by a monotonic
clock since (``CLOCK_BOOTTIME``, which also counts a suspend, so a laptop asleep for three
days does age its results). A step of the wall clock after the start does not move it.
``replay_now`` is the smaller of the two readings: an age measured from it can be made
shorter by a step (then a row is dropped late, by at most the step: the attempt budget and
the backoff still bound it), never longer, so no step can drop a fresh result.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["SteadyWall", "boot_clock"]


def boot_clock() -> float:
    """Seconds since boot, suspend included, never stepped (``CLOCK_BOOTTIME``; falls back
    to ``time.monotonic`` where the platform has no such clock)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return time.monotonic()
    return time.clock_gettime(boottime)


class SteadyWall:
    """Wall time as of this object's creation, moved on by ``monotonic`` only."""

    def __init__(self, wall: Callable[[], float], monotonic: Callable[[], float]) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._wall0 = wall()
        self._mono0 = monotonic()

    def now(self) -> float:
        return self._wall0 + (self._monotonic() - self._mono0)

    def replay_now(self, wall_now: float) -> float:
        """The "now" a replay age is measured from: ``wall_now``, unless the wall clock was
        stepped forward since this process started; then the steady reading."""
        return min(wall_now, self.now())
