"""Ledger ids: a prefix, then hex that sorts by creation time.

Time-ordered ids put new rows, and the rows being worked on, at the right edge of the
primary-key b-tree, so one commit touches a few pages instead of one random page per row:
with random ids every commit rewrote dozens of scattered 4 KiB pages into the WAL.
"""

from __future__ import annotations

import secrets
import time


def new_id(prefix: str) -> str:
    """``prefix`` + 13 hex digits of microseconds since the epoch + 6 random hex digits."""
    return f"{prefix}{time.time_ns() // 1000:013x}{secrets.token_hex(3)}"
