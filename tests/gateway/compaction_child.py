"""The process test_compaction.py kills with SIGKILL in the middle of a compaction.

Usage: compaction_child.py STORE_URL_OR_SQLITE_PATH MODEL_BASE_URL FIRST LAST

Runs turns FIRST..LAST of the compaction conversation (``compaction_support.drive``) and
writes ``TURN <n> <ok>`` (one os.write, after the turn returned) for each.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.session import SessionStore
from tests.gateway import compaction_support as cs
from tests.stores import pg_sessions, sqlite_sessions


def main() -> None:
    where, base_url, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    backend = pg_sessions(where) if where.startswith("postgresql") else sqlite_sessions(where)
    store = SessionStore(backend)

    def said(n: int, ok: bool) -> None:
        os.write(1, f"TURN {n} {ok}\n".encode())

    asyncio.run(cs.drive(store, cs.service_for(store, base_url), range(first, last + 1), said))


if __name__ == "__main__":
    main()
