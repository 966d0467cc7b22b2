"""``reveille_delivery_rows`` on PostgreSQL: a `reveille serve` whose ledger is in PostgreSQL
reports its waiting and claimed rows at ``GET /metrics``, as one on SQLite does (the counts
once came from a SQLite-only method, so on PostgreSQL the family was silently empty)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.api_server.serve_support import Server, chat, scrape, value, wait_until
from tests.pg_support import fresh_url


def test_delivery_rows_have_values_on_postgresql(tmp_path: Path) -> None:
    url = fresh_url()
    # hold_ack: the watcher delivers but never acknowledges, so the row stays pending and
    # claimed, and the gauge has something other than zeros to show.
    server = Server(tmp_path, hold_ack=True, extra_env={"REVEILLE_DATABASE_URL": url})
    try:
        before = scrape(server.port)
        for state in ("pending", "claimed"):
            assert ("reveille_delivery_rows", (("state", state),)) in before, before.keys()
            assert value(before, "reveille_delivery_rows", state=state) == 0
        chat(server.port, "in the background: count the stars")
        server.wait_for(re.compile(r"HOLDING-ACK deleg_\w+"))

        def claimed() -> dict | None:
            found = scrape(server.port)
            return found if value(found, "reveille_delivery_rows", state="claimed") == 1 else None

        after = wait_until(claimed, timeout=20)
        assert value(after, "reveille_delivery_rows", state="pending") == 1
        assert value(after, "reveille_writer_commits_total", store="ledger") > 0
    finally:
        server.stop()
