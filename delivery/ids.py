"""Ledger ids: a prefix, then hex that sorts by creation time.

Time-ordered ids put new rows, and the rows being worked on, at the right edge of the
primary-key b-tree, so one commit touches a few pages instead of one random page per row:
with random ids every commit rewrote dozens of scattered 4 KiB pages into the WAL.
"""

from __future__ import annotations

import os
import random
import re
import time

# Uniqueness, not secrecy, is what these need: a generator seeded from the OS once (and
# again in a forked child) costs far less than a system call per id.
_rng = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _rng.seed(os.urandom(32)))


def new_id(prefix: str) -> str:
    """``prefix`` + 13 hex digits of microseconds since the epoch + 6 random hex digits."""
    return f"{prefix}{time.time_ns() // 1000:013x}{_rng.getrandbits(24):06x}"


def new_token() -> str:
    """A 128-bit claim token."""
    return f"{_rng.getrandbits(128):032x}"


# A started unit's handle as tools hand it to the model and transcripts keep it: a sub-agent
# (``deleg_``) or a background process (``proc_``), each a ledger row written before the
# handle is returned.
UNIT_HANDLE = re.compile(r"\b(?:deleg|proc)_[0-9a-f]{19}\b")


def unit_handles(text: str) -> list[str]:
    """The started units' handles ``text`` names, each once, in order."""
    return list(dict.fromkeys(UNIT_HANDLE.findall(text)))
