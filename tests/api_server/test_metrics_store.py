"""``/metrics`` families read from the store: responses by status, approvals by status, and
the ledger's rows owing a delivery (by lifecycle state, and those due later). Two `reveille
serve` processes on one state directory report the same numbers, whichever did the work."""

from __future__ import annotations

import re
import time
from pathlib import Path

from delivery.session_backend import ApprovalRecord
from tests.api_server.serve_support import Server, call, chat, scrape, value, wait_until
from tests.stores import session_file_store

STORE_FAMILIES = (
    ("reveille_responses", "status", ("queued", "in_progress", "completed", "failed")),
    ("reveille_responses", "status", ("cancelled", "incomplete")),
    ("reveille_approvals", "status", ("pending", "approved", "denied", "expired")),
    ("reveille_ledger_pending_rows", "state", ("queued", "running")),
)


def test_store_families_exist_from_the_first_scrape_and_agree_across_servers(
    tmp_path: Path,
) -> None:
    # hold_ack: results are delivered but never acknowledged, so a row stays owed.
    first = Server(tmp_path, hold_ack=True)
    second = Server(tmp_path, hold_ack=True)
    try:
        fresh = scrape(first.port)
        for family, label, values in STORE_FAMILIES:
            for v in values:
                assert value(fresh, family, **{label: v}) == 0, (family, v)
        assert value(fresh, "reveille_ledger_rows_due_later") == 0

        chat(first.port, "in the background: count the stars")  # a delegation, owed
        status, _, created = call(
            second.port,
            "POST",
            "/v1/responses",
            {"model": "reveille-demo", "input": "hello", "background": True},
        )
        assert status == 200, created
        with session_file_store(tmp_path / "sessions.db") as store:  # a third writer
            store.take_turn("sess_asking", "st_1")
            asked = ApprovalRecord("appr_1", "sess_asking", "st_1", "ls", "pending", time.time())
            assert store.ask_approval(asked)

        def settled() -> list[dict] | None:
            found = [scrape(first.port), scrape(second.port)]
            done = all(
                value(f, "reveille_responses", status="completed") == 1
                and value(f, "reveille_ledger_pending_rows", state="completed") == 1
                for f in found
            )
            return found if done else None

        for found in wait_until(settled, timeout=30):
            assert value(found, "reveille_approvals", status="pending") == 1
            assert value(found, "reveille_responses", status="queued") == 0
            assert value(found, "reveille_ledger_pending_rows", state="running") == 0
        # The server's output is read on a thread of its own: the line may follow the scrape.
        wait_until(lambda: re.search(r"HOLDING-ACK deleg_\w+", "".join(first.lines + second.lines)))
    finally:
        first.stop()
        second.stop()
