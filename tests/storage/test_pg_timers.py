"""Timers at scale on PostgreSQL: a re-offer pass over a burst of due timers.

``bench/timers.py --store postgresql`` measures the firing lateness of 10,000 timers due in
one second; these hold the pieces it relies on: the compare-and-sets of a pass go as one
statement per shape of them (``storage.postgres.cas_batch``), whose array types must be the
columns' own, and a pass costs the same few round trips however many timers it takes.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

import storage
from delivery.events import SCHEDULED_WAKEUP, TIMER_KIND
from delivery.ledger import Ledger
from storage.postgres import trips
from storage.postgres.cas_batch import ARRAY_TYPES
from tests.pg_support import fresh_url

_PG_TYPES = {"double precision": "float8[]", "integer": "int4[]", "text": "text[]"}


def test_the_array_types_of_a_batch_are_the_columns_own() -> None:
    url = fresh_url()
    storage.open_storage(url).open_ledger().close()  # migrates the schema
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_name = 'deliveries' AND table_schema = current_schema()"
        ).fetchall()
    stored = {name: _PG_TYPES.get(kind, kind) for name, kind in found if name != "seq"}
    assert stored == ARRAY_TYPES


def _timers(ledger: Ledger, count: int, due: float) -> list[str]:
    ids = [f"tmr_{count}_{n:04d}" for n in range(count)]
    for row_id in ids:
        event = {"type": SCHEDULED_WAKEUP, "delivery_id": row_id, "status": "completed"}
        ledger.schedule(row_id, kind=TIMER_KIND, event=event, not_before=due, session_key="s")
    return ids


def test_a_pass_over_a_burst_costs_a_few_trips_however_many_timers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(trips.ENV, str(tmp_path))  # the stores open counting connections
    clock = [1000.0]
    ledger = Ledger(storage.open_storage(fresh_url()).open_ledger(), clock=lambda: clock[0])
    try:
        counts = []
        for size in (5, 300):
            ids = _timers(ledger, size, due=clock[0] + 10)
            clock[0] += 20
            before = trips.total()
            offered = ledger.take_due(limit=500)
            counts.append(trips.total() - before)
            assert sorted(e["delivery_id"] for e in offered) == ids
            assert all(e["restored"] and e["_first_offer"] for e in offered)
            for row_id in ids:
                row = ledger.get(row_id)
                assert row is not None and row.holder == ledger.identity
                assert row.due_at == clock[0] + ledger.policy.lease_seconds and row.restored == 1
                token = ledger.claim(row_id, "test")
                assert token is not None and ledger.complete(row_id, token)
        assert counts[1] == counts[0] <= 6, counts
    finally:
        ledger.close()
