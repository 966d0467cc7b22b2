"""Timers at scale on PostgreSQL: a re-offer pass over a burst of due timers.

``bench/timers.py --store postgresql`` measures the firing lateness of 10,000 timers due in
one second; these hold the pieces it relies on: the compare-and-sets of a pass go as one
statement per shape of them (``storage.postgres.cas_batch``), whose array types must be the
columns' own, a pass costs the same few round trips however many timers it takes (its
due rows read and locked in the round trip that opens its transaction), two servers
taking one burst at once offer each timer once, and two survivors taking over a dead
server's waiting timers at once take each once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import storage
from delivery.backend import AtMost, Increment, LedgerTx
from delivery.events import SCHEDULED_WAKEUP, TIMER_KIND
from delivery.ledger import Ledger
from storage.postgres import sql, trips
from storage.postgres.cas_batch import SQL_TYPES, BatchCompiler
from tests.delivery._support import exited_identity
from tests.pg_support import fresh_url

_PG_TYPES = {"double precision": "float8", "integer": "int4", "text": "text"}


def test_the_types_a_batch_reads_its_values_as_are_the_columns_own() -> None:
    url = fresh_url()
    storage.open_storage(url).open_ledger().close()  # migrates the schema
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_name = 'deliveries' AND table_schema = current_schema()"
        ).fetchall()
    stored = {name: _PG_TYPES.get(kind, kind) for name, kind in found if name != "seq"}
    assert stored == SQL_TYPES


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
        # The dead holders' read; BEGIN with the due rows read and locked; the offers'
        # compare-and-sets; COMMIT.
        assert counts[1] == counts[0] <= 4, counts
    finally:
        ledger.close()


def test_a_pass_written_apart_neither_waits_for_the_writer_nor_touches_its_rows() -> None:
    """A re-offer pass commits beside a writer batch in flight (``write(apart=True)``):
    it is not queued behind the batch, and skips the row that batch holds locked, exactly
    as another server's pass would."""
    backend = storage.open_storage(fresh_url()).open_ledger()
    ledger = Ledger(backend)
    try:
        _timers(ledger, 2, due=0.0)
        held, release = threading.Event(), threading.Event()

        def busy(tx: LedgerTx) -> None:  # a batch of claims, say, holding tmr_2_0000
            tx.update("tmr_2_0000", {}, {"claim_consumer": "busy"})
            held.set()
            release.wait(10)

        in_flight = threading.Thread(target=backend.write, args=(busy,))
        in_flight.start()
        assert held.wait(10)

        def take(tx: LedgerTx) -> list[bool]:
            free = tx.lock_free(["tmr_2_0000", "tmr_2_0001"])
            return tx.update_many([(r, {}, {"holder": "apart"}) for r in sorted(free)])

        assert backend.write(take, apart=True) == [True]  # only the row not held
        assert in_flight.is_alive()
        release.set()
        in_flight.join(10)
        rows = [backend.get(f"tmr_2_000{n}") for n in range(2)]
        assert [r.holder if r else None for r in rows] == [ledger.identity, "apart"]
        assert backend.stats()["apart_commits"] == 1
    finally:
        ledger.close()


@contextlib.contextmanager
def _held_by_a_batch_in_flight(backend: Any, row_id: str) -> Iterator[threading.Thread]:
    """A writer batch (of claims, say) that holds ``row_id`` until the block ends; the
    thread that waits for it."""
    held, release = threading.Event(), threading.Event()

    def busy(tx: LedgerTx) -> None:
        tx.update(row_id, {}, {"claim_consumer": "busy"})
        held.set()
        release.wait(10)

    in_flight = threading.Thread(target=backend.write, args=(busy,))
    in_flight.start()
    try:
        assert held.wait(10)
        yield in_flight
    finally:
        release.set()
        in_flight.join(10)


def test_a_pass_reads_its_due_rows_locked_and_skips_those_another_transaction_holds() -> None:
    """A re-offer batch reads the due rows in the transaction that offers them, locked for
    it (``PostgresBackend.write_due``): a row a writer batch in flight holds is skipped,
    not waited for, and the rows read need no second trip to be locked."""
    backend = storage.open_storage(fresh_url()).open_ledger()
    ledger = Ledger(backend)
    try:
        ids = _timers(ledger, 3, due=0.0)
        with _held_by_a_batch_in_flight(backend, ids[0]) as in_flight:
            offered = ledger.take_due(limit=500)
            assert sorted(e["delivery_id"] for e in offered) == ids[1:]
            assert in_flight.is_alive()
        (late,) = ledger.take_due(limit=500)  # once the batch let go of it
        assert late["delivery_id"] == ids[0]
        assert ledger.take_due(limit=500) == []
    finally:
        ledger.close()


def test_two_servers_taking_one_burst_at_once_offer_each_timer_once() -> None:
    """Two stores on one database (two servers) take a burst of due timers batch after
    batch at the same time: each timer is offered by one of them, once."""
    url = fresh_url()
    first = Ledger(storage.open_storage(url).open_ledger())
    second = Ledger(storage.open_storage(url).open_ledger())
    try:
        ids = _timers(first, 400, due=0.0)
        offered: list[list[str]] = [[], []]
        start = threading.Barrier(2)

        def take(ledger: Ledger, into: list[str]) -> None:
            start.wait(10)
            batch = True
            while batch:
                batch = [e["delivery_id"] for e in ledger.take_due(limit=25)]
                into.extend(batch)

        threads = [
            threading.Thread(target=take, args=(ledger, into))
            for ledger, into in zip((first, second), offered, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(offered[0] + offered[1]) == ids  # every timer, none twice
        assert first.take_due() == [] and second.take_due() == []
    finally:
        first.close()
        second.close()


def test_two_survivors_take_over_a_dead_servers_waiting_timers_each_once() -> None:
    """Two servers take over the timers of a dead one at the same time, a statement per 25
    (``LedgerTx.adopt_waiting``): each timer becomes one survivor's, once; a row the other
    has locked is skipped, not waited for (two such statements never deadlock)."""
    url = fresh_url()
    backends = [storage.open_storage(url).open_ledger() for _ in range(2)]
    dead = Ledger(backends[0], identity=exited_identity())
    try:
        ids = _timers(dead, 400, due=time.time() + 3600)
        counts: list[list[int]] = [[], []]
        start = threading.Barrier(2)

        def adopt(backend: Any, into: list[int], me: str) -> None:
            start.wait(10)
            while True:
                step = backend.write(
                    lambda tx: tx.adopt_waiting(dead.identity, me, time.time(), 25), apart=True
                )
                into.append(step)
                if step == 0:
                    return

        threads = [
            threading.Thread(target=adopt, args=(backend, into, f"survivor-{n}"))
            for n, (backend, into) in enumerate(zip(backends, counts, strict=True))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sum(counts[0]) + sum(counts[1]) == len(ids)  # none twice
        holders = {row_id: backends[0].get(row_id).holder for row_id in ids}  # type: ignore[union-attr]
        assert set(holders.values()) <= {"survivor-0", "survivor-1"}  # none left to the dead
    finally:
        for backend in backends:
            backend.close()


def test_a_waiting_row_another_transaction_holds_is_left_for_the_next_pass() -> None:
    backend = storage.open_storage(fresh_url()).open_ledger()
    dead = Ledger(backend, identity=exited_identity())
    try:
        ids = _timers(dead, 3, due=time.time() + 3600)

        def adopt() -> int:
            now = time.time()
            return backend.write(
                lambda tx: tx.adopt_waiting(dead.identity, "me", now, 10), apart=True
            )

        with _held_by_a_batch_in_flight(backend, ids[0]) as in_flight:
            assert adopt() == 2  # at once: not waiting for the batch in flight
            assert in_flight.is_alive()
        assert adopt() == 1
        assert {backend.get(row_id).holder for row_id in ids} == {"me"}  # type: ignore[union-attr]
    finally:
        backend.close()


async def _one_writer_batch(backend: Any, *ops: Callable[[LedgerTx], object]) -> list[object]:
    """Run ``ops`` as one batch of the writer's (it is held until all are queued)."""
    running, go = threading.Event(), threading.Event()

    def hold(tx: LedgerTx) -> None:
        running.set()
        go.wait(10)

    held = backend.submit_async(hold)
    await asyncio.to_thread(running.wait, 10)
    futures = [backend.submit_async(op) for op in ops]
    go.set()
    await held
    return list(await asyncio.gather(*futures))


def cas(row_id: str, expect: dict[str, Any], changes: dict[str, Any]) -> Any:
    return lambda tx: tx.update(row_id, expect, changes)


async def test_a_writer_batch_of_compare_and_sets_answers_each_as_alone() -> None:
    """The claims and acknowledgements of a burst reach the writer hundreds to a batch, each
    on a row of its own: the updates of one shape go as one statement, and each still
    answers (and changes its row) as it would alone; a batch where two touch one row goes
    statement by statement, in order."""
    backend = storage.open_storage(fresh_url()).open_ledger()
    ledger = Ledger(backend)
    try:
        ids = _timers(ledger, 6, due=0.0)

        batch = functools.partial(_one_writer_batch, backend)

        answers = await batch(
            cas(ids[0], {"claim_expires_at": AtMost(0)}, {"claim_consumer": "a"}),
            cas(ids[1], {"claim_expires_at": AtMost(-1.5)}, {"claim_consumer": "b"}),  # miss
            cas(ids[2], {"claim_expires_at": AtMost(0.5)}, {"claim_consumer": "c"}),
            cas(ids[3], {"holder": None}, {"delivery_attempts": Increment(2)}),  # miss
            cas(ids[4], {"holder": ledger.identity}, {"delivery_attempts": Increment(2)}),
            cas("missing", {"claim_expires_at": AtMost(0)}, {"claim_consumer": "m"}),  # miss
        )
        assert answers == [True, False, True, False, True, False]
        rows = {r: backend.get(r) for r in ids}
        assert [rows[r].claim_consumer for r in ids[:3]] == ["a", None, "c"]  # type: ignore[union-attr]
        assert [rows[r].delivery_attempts for r in ids[3:5]] == [0, 2]  # type: ignore[union-attr]

        answers = await batch(  # one row twice: the second sees the first's change
            cas(ids[5], {"claim_consumer": None}, {"claim_consumer": "x"}),
            cas(ids[5], {"claim_consumer": None}, {"claim_consumer": "y"}),
            cas(ids[0], {"claim_consumer": "a"}, {"claim_consumer": "z"}),
            cas(ids[2], {"claim_consumer": "c"}, {"claim_consumer": "w"}),
        )
        assert answers == [True, False, True, True]
        assert [backend.get(r).claim_consumer for r in (ids[5], ids[0])] == ["x", "z"]  # type: ignore[union-attr]
    finally:
        ledger.close()


async def test_a_batch_keeps_every_value_exactly_even_those_json_cannot_write() -> None:
    """A batch's values travel as JSON text (``storage.postgres.cas_batch``): floats as their
    shortest text, text beyond ASCII as it is, and what JSON has no form for (a NaN, an
    infinity: a batch holding one goes statement by statement) all reach their rows as they
    would alone, and an equality on a stored float matches it again."""
    backend = storage.open_storage(fresh_url()).open_ledger()
    ledger = Ledger(backend)
    try:
        ids = _timers(ledger, 8, due=0.0)
        # Two batches of four (a writer batch of fewer goes statement by statement anyway):
        # finite floats only, then the ones JSON cannot write beside a finite one.
        floats = [0.1 + 0.2, 1e16, 1.7976931348623157e308, -2.5e-300]
        floats += [math.nan, math.inf, -math.inf, 42.5]
        names = ["\u00e9t\u00e9", "\u65e5\u672c", "\U0001f389", 'a " and a \\', "\u2028"]
        names += ["plain", "", "tab\there"]
        claims = [
            cas(row_id, {"claim_consumer": None}, {"claimed_at": at, "claim_consumer": name})
            for row_id, at, name in zip(ids, floats, names, strict=True)
        ]
        assert await _one_writer_batch(backend, *claims[:4]) == [True] * 4
        assert await _one_writer_batch(backend, *claims[4:]) == [True] * 4
        rows = [backend.get(row_id) for row_id in ids]
        assert [row.claim_consumer for row in rows] == names  # type: ignore[union-attr]
        stored = [row.claimed_at for row in rows]  # type: ignore[union-attr]
        assert math.isnan(stored[4])
        assert stored[:4] + stored[5:] == floats[:4] + floats[5:]

        finite = list(zip(ids[:4] + ids[7:], floats[:4] + floats[7:], strict=True))
        again = (cas(row_id, {"claimed_at": at}, {"claim_consumer": "x"}) for row_id, at in finite)
        assert await _one_writer_batch(backend, *again) == [True] * 5
    finally:
        ledger.close()


def test_an_integer_beyond_64_bits_is_written_exactly_or_refused_never_rounded() -> None:
    """``orjson`` refuses an integer beyond 64 bits: the batch's text is then the standard
    library's, which keeps every digit (PostgreSQL refuses it for an integer column; a
    float rounded silently would have been another value)."""
    huge = 2**70 + 1
    update = ("tmr_1", {"holder": "h"}, {"delivery_attempts": Increment(huge)})
    statement = BatchCompiler().statement([update])
    assert statement is not None
    assert json.loads(statement[1][0]) == [["tmr_1", huge, "h"]]


def test_the_next_due_time_is_read_through_the_due_index_under_a_plan_made_when_empty() -> None:
    """Every scheduler pass ends by reading the earliest due time, a statement each pooled
    connection prepares once, often while the ledger is still empty. The plan it keeps must
    still read the first entry of the due index however many timers are pending later, not
    every pending row (a ``min()`` planned on an empty table did)."""
    url = fresh_url()
    ledger = Ledger(storage.open_storage(url).open_ledger(), clock=lambda: 1000.0)
    try:
        assert ledger.next_due_at() is None
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"PREPARE next_due AS {sql.LEDGER_NEXT_DUE}")
            conn.execute("EXECUTE next_due")  # planned now, on the empty ledger, and kept
            _timers(ledger, 200, due=5000.0)
            ledger.schedule(
                "tmr_first",
                kind=TIMER_KIND,
                event={"type": SCHEDULED_WAKEUP, "delivery_id": "tmr_first", "status": "completed"},
                not_before=4000.0,
            )
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN EXECUTE next_due"))
            assert "ix_pending_due" in plan and "Limit" in plan, plan
            assert conn.execute("EXECUTE next_due").fetchall() == [(4000.0,)]
        assert ledger.next_due_at() == 4000.0
    finally:
        ledger.close()
