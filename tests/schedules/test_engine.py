"""Schedules on the ledger (``delivery.schedules_engine``), over every backend: one
occurrence row at a time, named by its instant, fired once however many servers race; the
misfire policies after an outage; pause, resume and cancel."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delivery.ledger import Ledger
from delivery.schedules import ACTIVE, CANCELLED, PAUSED, SCHEDULE_KIND, Misfire, occurrence_id
from delivery.schedules_engine import MISSED_STATUS, ScheduleEngine, ScheduleNotFound
from tests.delivery._support import REMOTE_IDENTITY, FakeClock
from tests.schedules._support import BACKENDS, Stores, open_stores


@pytest.fixture(params=BACKENDS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    s = open_stores(str(request.param), tmp_path, FakeClock(1_800_000_000.0))
    yield s
    s.close()


def deliver(ledger: Ledger, engine: ScheduleEngine) -> list[dict[str, Any]]:
    """One server's pass: advance due schedules, then claim and acknowledge what is due."""
    engine.advance_due()
    out = []
    for event in ledger.take_due():
        token = ledger.claim(event["delivery_id"], "test")
        if token and ledger.complete(event["delivery_id"], token):
            out.append(event)
    return out


def pending_rows(ledger: Ledger) -> list[str]:
    from delivery.rows import RowQuery

    rows = ledger.query(RowQuery(kind=SCHEDULE_KIND, delivery_state="pending", limit=1000))
    return sorted(r.id for r in rows)


def test_one_occurrence_row_at_a_time_fired_at_its_period(stores: Stores) -> None:
    clock, engine, ledger = stores.clock, stores.engine, stores.ledger
    s = engine.create(note="stretch", every_seconds=60, session_key="k", origin_session_id="o")
    assert s.next_at == int(clock()) + 60
    assert pending_rows(ledger) == [occurrence_id(s.id, s.next_at)]
    assert deliver(ledger, engine) == []
    fired = []
    for _ in range(3):
        clock.advance(60)
        fired += deliver(ledger, engine)
    assert [e["due_at"] for e in fired] == [s.next_at, s.next_at + 60, s.next_at + 120]
    assert all(e["note"] == "stretch" and e["missed"] == 0 for e in fired)
    assert pending_rows(ledger) == [occurrence_id(s.id, s.next_at + 180)]
    after = engine.get(s.id)
    assert after.fired == 3 and after.next_at == s.next_at + 180


def test_two_servers_fire_each_occurrence_once(stores: Stores) -> None:
    clock, engine, ledger = stores.clock, stores.engine, stores.ledger
    other = Ledger(ledger.backend, clock=clock, monotonic=clock.monotonic, identity=REMOTE_IDENTITY)
    other_engine = ScheduleEngine(other, stores.schedules)
    s = engine.create(note="n", every_seconds=30, session_key="k")
    fired: list[str] = []
    for _ in range(5):
        clock.advance(30)
        other_engine.advance_due()  # both decide and write the next row: one wins each
        fired += [e["delivery_id"] for e in deliver(ledger, engine) + deliver(other, other_engine)]
    assert s.next_at is not None
    assert fired == [occurrence_id(s.id, s.next_at + 30 * i) for i in range(5)]
    assert engine.get(s.id).fired == 5


def test_fire_once_collapses_an_outage_into_one_firing(stores: Stores) -> None:
    clock, engine, ledger = stores.clock, stores.engine, stores.ledger
    s = engine.create(note="n", every_seconds=60, session_key="k")
    clock.advance(60 * 10 + 45)  # down for ten periods
    (event,) = deliver(ledger, engine)
    assert event["status"] == "completed" and event["missed"] == 9
    after = engine.get(s.id)
    assert after.fired == 1 and after.missed == 9 and after.next_at == s.next_at + 600
    assert deliver(ledger, engine) == []


def test_skip_writes_a_visible_missed_event(stores: Stores) -> None:
    clock, engine, ledger = stores.clock, stores.engine, stores.ledger
    s = engine.create(note="n", every_seconds=3600, misfire=Misfire("skip"), session_key="k")
    clock.advance(3 * 3600 + 120)
    (event,) = deliver(ledger, engine)
    assert event["status"] == MISSED_STATUS and event["missed"] == 2
    after = engine.get(s.id)
    assert after.fired == 0 and after.missed == 3
    clock.advance(after.next_at - clock())  # next one on time: runs
    (on_time,) = deliver(ledger, engine)
    assert on_time["status"] == "completed"


def test_fire_if_within(stores: Stores) -> None:
    clock, engine, ledger = stores.clock, stores.engine, stores.ledger
    engine.create(
        note="n", every_seconds=3600, misfire=Misfire("fire_if_within", 600), session_key="k"
    )
    clock.advance(3600 + 300)
    assert deliver(ledger, engine)[0]["status"] == "completed"
    clock.advance(3600 + 400)  # 700 s late
    assert deliver(ledger, engine)[0]["status"] == MISSED_STATUS


def test_pause_resume_cancel(stores: Stores) -> None:
    clock, engine, ledger = stores.clock, stores.engine, stores.ledger
    s = engine.create(note="n", every_seconds=60, session_key="k")
    paused = engine.pause(s.id, session="k")
    assert paused.state == PAUSED and pending_rows(ledger) == []
    clock.advance(600)
    assert deliver(ledger, engine) == []
    resumed = engine.resume(s.id)
    assert resumed.state == ACTIVE and resumed.next_at is not None
    assert resumed.next_at > clock()
    assert pending_rows(ledger) == [occurrence_id(s.id, resumed.next_at)]
    cancelled = engine.cancel(s.id)
    assert cancelled.state == CANCELLED and pending_rows(ledger) == []
    clock.advance(3600)
    assert deliver(ledger, engine) == []
    assert engine.find(session="k") == []
    assert [x.id for x in engine.find(session="k", include_cancelled=True)] == [s.id]


def test_another_conversations_schedule_is_not_found(stores: Stores) -> None:
    s = stores.engine.create(note="n", every_seconds=60, session_key="mine")
    with pytest.raises(ScheduleNotFound):
        stores.engine.cancel(s.id, session="theirs")
    with pytest.raises(ScheduleNotFound):
        stores.engine.get("sch_nope")
    assert stores.schedules.count_active("mine") == 1


def test_a_crash_between_the_schedule_and_its_row_is_repaired(stores: Stores) -> None:
    clock, engine, ledger = stores.clock, stores.engine, stores.ledger
    s = engine.create(note="n", every_seconds=60, session_key="k")
    assert s.next_at is not None
    row_id = occurrence_id(s.id, s.next_at)
    ledger.cancel(row_id, by="test")  # as if the row had never been written ...
    clock.advance(60)
    assert engine.advance_due() == 1  # ... the pass moves on all the same
    assert pending_rows(ledger) == [occurrence_id(s.id, s.next_at + 60)]


def test_servers_racing_at_once_fire_each_occurrence_once(stores: Stores) -> None:
    """Four servers pass at the same moments on threads (on PostgreSQL: four connections
    locking the same rows): every occurrence is decided, written and delivered once."""
    import threading

    clock, ledger = stores.clock, stores.ledger
    servers = [
        (
            other := Ledger(
                ledger.backend,
                clock=clock,
                monotonic=clock.monotonic,
                identity=f"{REMOTE_IDENTITY}{i}",
            ),
            ScheduleEngine(other, stores.schedules),
        )
        for i in range(4)
    ]
    s = stores.engine.create(note="n", every_seconds=30, session_key="k")
    delivered: list[str] = []
    lock = threading.Lock()
    for _ in range(6):
        clock.advance(30)
        start = threading.Barrier(len(servers))

        def serve(server: tuple[Ledger, ScheduleEngine], start: threading.Barrier) -> None:
            start.wait()
            got = deliver(*server)
            with lock:
                delivered.extend(e["delivery_id"] for e in got)

        threads = [threading.Thread(target=serve, args=(srv, start)) for srv in servers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert s.next_at is not None
    assert sorted(delivered) == [occurrence_id(s.id, s.next_at + 30 * i) for i in range(6)]
    after = stores.engine.get(s.id)
    assert after.fired == 6 and after.missed == 0


def test_an_outage_longer_than_the_replay_cap_still_fires_once(stores: Stores) -> None:
    """The ledger drops rows older than 48 h instead of replaying them; an occurrence decided
    after a longer outage is news, so its age counts from the decision (found by the soak)."""
    clock, engine, ledger = stores.clock, stores.engine, stores.ledger
    engine.create(note="n", every_seconds=3600, session_key="k")
    clock.advance(3 * 86400 + 600)
    (event,) = deliver(ledger, engine)
    assert event["status"] == "completed" and event["missed"] == 71


def test_a_quick_pause_and_resume_loses_no_occurrence(stores: Stores) -> None:
    clock, engine, ledger = stores.clock, stores.engine, stores.ledger
    s = engine.create(note="n", every_seconds=60, session_key="k")
    engine.pause(s.id)  # settles the row of the coming occurrence ...
    resumed = engine.resume(s.id)  # ... so it resumes from the one after
    assert resumed.next_at == (s.next_at or 0) + 60
    clock.advance(120)
    assert [e["due_at"] for e in deliver(ledger, engine)] == [resumed.next_at]
