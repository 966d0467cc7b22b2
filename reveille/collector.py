"""The process's garbage collector, set for a long-running server once its start is done.

CPython frees nearly everything by reference counting; its cyclic collector exists for
the rest and by default looks at the youngest objects every 700 allocations. Under load
that is far too often for a server: a turn's or a wake-up's objects (tasks, futures,
events, rows) are alive for a few milliseconds, so each young collection finds hundreds
of them still in flight and promotes them. They pile up in the old generation until it
has grown by a quarter, and then a full collection walks every object of the process
with every thread stopped: 40 to 80 ms at a time, four or five times in a burst of
10,000 timers due at once (``bench/timers.py``): a fifth to two fifths of the process's
CPU over the burst.

``settle`` makes two changes:

- It freezes what the start built (modules, routes, clients: about 150,000 objects), so
  that full collections walk only what came after.
- It collects the young generation every 50,000 allocations, so that most of a request's
  objects are gone before the collector first looks, and few reach the old generation.

Garbage in reference cycles still goes: later, at most 50,000 allocations' worth at a time.
"""

from __future__ import annotations

import gc

__all__ = ["THRESHOLDS", "settle"]

# (young, middle, old): allocations between young collections; young collections between
# middle ones; middle ones between full ones (a full one also waits for the old
# generation to grow by a quarter). CPython's defaults are (700, 10, 10).
THRESHOLDS = (50_000, 20, 20)


def settle() -> None:
    """Call once the process's start is done: everything alive now is kept out of the
    collector's sight, and the collector runs at ``THRESHOLDS``."""
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
