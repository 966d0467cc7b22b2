"""Retention over every backend (SQLite, memory, PostgreSQL): with every kind aged past its
setting, a prune removes settled things only, leaves a tombstone that answers late
questions, and a conversation whose result was never folded still gets it; SQLite files
shrink. Ages come from a ``now`` given to the prune, days after the rows were written.
Every kind is covered, archived transcript rows and stored responses included."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

import storage
from delivery.backend import LedgerStore
from delivery.events import TRANSCRIPT_KEY_PREFIX
from delivery.ledger import Ledger
from delivery.responses_backend import Change, ResponseRow
from delivery.retention import (
    DAY,
    KINDS,
    PruneReport,
    RetentionPolicy,
    RetentionScheduler,
    RetentionStores,
    run_retention,
)
from delivery.session_backend import NewMessage, NewSession, SessionBackend
from delivery.webui_state import WebUIStateBackend
from gateway.session import SessionStore
from gateway.wake import persist_delegation_delivery
from storage.sqlite.ledger import SCHEMA_VERSION
from tests.delivery._support import BACKENDS, FakeClock, delegation_event, finished_row
from tests.pg_support import fresh_url
from tests.sessions._support import append_turn, begin, delivery, make_session, run_sync

POLICY = RetentionPolicy(
    settled_days=30,
    idempotency_days=7,
    tombstone_days=90,
    webui_event_days=7,
    process_output_days=7,
    batch=3,  # several batches even with a handful of rows
)


@dataclass
class World:
    kind: str
    location: storage.Storage
    backend: LedgerStore
    ledger: Ledger
    sessions: SessionBackend
    webui: WebUIStateBackend
    processes: Path
    clock: FakeClock

    def stores(self) -> RetentionStores:
        return RetentionStores(
            self.backend,
            self.sessions,
            self.webui,
            self.processes,
            self.location.reclaim_space,
        )


@pytest.fixture(params=BACKENDS)
def w(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    kind = str(request.param)
    url = {
        "sqlite": f"sqlite://{tmp_path / 'home'}",
        "memory": "memory://retention",
    }.get(kind) or fresh_url()
    location = storage.open_storage(url)
    clock = FakeClock()
    backend = location.open_ledger()
    sessions = location.open_sessions(clock=clock)
    webui = location.open_webui()
    processes = tmp_path / "processes"
    processes.mkdir()
    w = World(
        kind,
        location,
        backend,
        Ledger(backend, clock=clock, monotonic=clock.monotonic),
        sessions,
        webui,
        processes,
        clock,
    )
    yield w
    webui.close()
    sessions.close()
    backend.close()


def _deliver(ledger: Ledger, row_id: str) -> None:
    token = ledger.claim(row_id, "test")
    assert token and ledger.complete(row_id, token)


def _aged(w: World, days: float) -> float:
    return w.clock() + days * DAY


def test_prune_removes_settled_rows_only_and_leaves_tombstones(w: World) -> None:
    ledger = w.ledger
    finished_row(ledger, "deleg_delivered")
    _deliver(ledger, "deleg_delivered")
    finished_row(ledger, "deleg_dropped")
    assert ledger.drop("deleg_dropped", "session deleted")
    finished_row(ledger, "deleg_pending")  # a result not delivered yet
    finished_row(ledger, "deleg_claimed")
    assert ledger.claim("deleg_claimed", "test")  # under a claim, still pending
    ledger.create("deleg_running", kind="delegation", state="running")
    ledger.create("deleg_queued", kind="delegation")
    # Dropped while it ran: its delivery settled, its work did not end.
    ledger.create("deleg_dropped_running", kind="delegation", state="running")
    assert ledger.drop("deleg_dropped_running", "notify_on_complete was off")
    w.clock.advance(20 * DAY)
    finished_row(ledger, "deleg_recent")  # settled 20 days later: not old enough
    _deliver(ledger, "deleg_recent")
    assert ledger.history("deleg_dropped")

    now = w.clock() + 15 * DAY  # 35 days after the first rows, 15 after the recent one
    dry = run_retention(w.stores(), POLICY, now=now, dry_run=True)
    assert _count(dry, "settled_ledger_rows") == 2
    assert ledger.get("deleg_delivered") is not None  # a dry run writes nothing

    report = run_retention(w.stores(), POLICY, now=now)
    assert _count(report, "settled_ledger_rows") == 2
    assert ledger.get("deleg_delivered") is None and ledger.get("deleg_dropped") is None
    for kept in (
        "deleg_pending",
        "deleg_claimed",
        "deleg_running",
        "deleg_queued",
        "deleg_dropped_running",
        "deleg_recent",
    ):
        assert ledger.get(kept) is not None, kept
    assert ledger.history("deleg_dropped") == []  # its audit entries went with it

    tomb = ledger.pruned("deleg_delivered")
    assert tomb is not None
    assert (tomb.state, tomb.delivery_state, tomb.pruned_at) == ("completed", "delivered", now)
    assert tomb.describe().startswith("pruned on ")
    assert "30 days" in tomb.reason
    assert ledger.pruned("deleg_pending") is None

    # The tombstones expire in turn, after their own setting.
    later = now + 91 * DAY
    gone = run_retention(w.stores(), replace(POLICY, settled_days=0), now=later)
    assert _count(gone, "tombstones") == 2
    assert ledger.pruned("deleg_delivered") is None


def test_a_result_not_folded_yet_is_kept_and_still_reaches_its_conversation(w: World) -> None:
    store = SessionStore(w.sessions)
    session = make_session(store, title="api", session_id="api_sess").id
    w.ledger.create("deleg_api", kind="delegation", state="running", origin_session_id=session)
    event = delegation_event("deleg_api", origin_session_id=session, goal="count the stars")
    assert w.ledger.finish("deleg_api", expected="running", state="completed", event=event)
    persist_delegation_delivery(store, session, event)  # the API target's delivery
    _deliver(w.ledger, "deleg_api")

    now = _aged(w, 400)  # every kind far past its days
    report = run_retention(w.stores(), POLICY, now=now)
    assert _count(report, "settled_ledger_rows") == 0
    assert w.ledger.get("deleg_api") is not None

    async def next_turn() -> list[str]:
        start = await w.sessions.abegin_turn(session, None)
        return [m.content for m in start.taken]

    taken = asyncio.run(next_turn())
    assert len(taken) == 1 and "count the stars" in taken[0]
    # Folded now: the ledger row may go (its result is in the transcript).
    report = run_retention(w.stores(), POLICY, now=now)
    assert _count(report, "settled_ledger_rows") == 1
    assert store.messages(session)  # the transcript is not retention's to prune


def test_the_transcript_key_is_the_one_the_api_target_writes(w: World) -> None:
    store = SessionStore(w.sessions)
    session = make_session(store, title="api", session_id="api_key").id
    event = delegation_event("deleg_k", origin_session_id=session)
    persist_delegation_delivery(store, session, event)
    pair = (session, TRANSCRIPT_KEY_PREFIX + "deleg_k")
    assert w.sessions.unfolded_deliveries([pair, (session, "deleg:other")]) == {pair}


def test_idempotency_tombstones_events_and_process_outputs(w: World) -> None:
    sessions = w.sessions
    sessions.claim_idempotent("idem_running", "me", None, None)  # a live claim
    run_sync(
        sessions.aappend_turn(
            "s_idem",
            [NewMessage.build({"role": "user", "content": "hi"})],
            create=NewSession(),
            idempotency_key="idem_done",
            response_json=json.dumps({"ok": True}),
        )
    )
    run_sync(sessions.acreate_session("s_gone", NewSession()))
    sessions.delete_session("s_gone")
    for n in range(5):
        w.webui.append_event("delivery", json.dumps({"n": n}), w.clock())
    newest = w.webui.newest_event_id()

    ended = w.processes / "proc_ended"
    running = w.processes / "proc_running"
    stranger = w.processes / "proc_stranger"
    w.ledger.create("proc_ended", kind="process", state="running")
    assert w.ledger.finish(
        "proc_ended", expected="running", state="completed", event={"type": "completion"}
    )
    w.ledger.create("proc_running", kind="process", state="running")
    for d in (ended, running, stranger):
        d.mkdir()
        (d / "output").write_text("out")
        old = w.clock() - 30 * DAY
        os.utime(d / "output", (old, old))
        os.utime(d, (old, old))

    now = _aged(w, 100)
    report = run_retention(w.stores(), POLICY, now=now)
    assert _count(report, "idempotency_records") == 1
    assert _count(report, "webui_events") == 5
    assert _count(report, "process_outputs") == 1
    assert _count(report, "tombstones") == 1  # the deleted session's
    assert sessions.claim_idempotent("idem_running", "other", None, None)[0].owner == "me"
    record, mine = sessions.claim_idempotent("idem_done", "other", None, None)
    assert mine and record.state == "running"  # the old answer is gone: a fresh claim
    assert w.webui.events_after(0, 10) == []
    assert w.webui.newest_event_id() == newest  # a tab that saw it is told to reset
    assert not ended.exists() and running.exists() and stranger.exists()
    assert _notes(report) == {}  # every kind is wired


def test_archived_transcript_rows_go_the_summary_and_live_rows_stay(w: World) -> None:
    store = SessionStore(w.sessions)
    make_session(store, "s_compact")
    user = store.append_message("s_compact", "user", "the old question")
    answer = store.append_message("s_compact", "assistant", "the old answer")
    result = delivery(store, "s_compact", 7)
    begin(store, "s_compact")  # a turn folds the result ...
    append_turn(
        store,  # ... and its stored turn saw it, so compaction may archive it
        "s_compact",
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}],
        seen=[result.id],
    )
    owed = delivery(store, "s_compact", 8)  # a later result no turn has folded yet
    assert store.take_turn("s_compact", "st_1").stream_id == "st_1"
    summary = run_sync(
        store.acompact(
            "s_compact",
            "st_1",
            [user.id, answer.id, result.id],
            {"role": "system", "content": "[reveille:summary] before", "display_metadata": {}},
        )
    )
    assert summary is not None
    assert store.end_turn("s_compact", "st_1")
    w.clock.advance(20 * DAY)
    store.append_message("s_compact", "user", "a live row, older than the setting at prune")
    archived = {user.id, answer.id, result.id}

    not_yet = run_retention(w.stores(), POLICY, now=_aged(w, 0))  # archived 20 days ago
    assert _count(not_yet, "archived_transcript_rows") == 0
    now = _aged(w, 15)  # archived 35 days before, the live row 15
    dry = run_retention(w.stores(), POLICY, now=now, dry_run=True)
    assert _count(dry, "archived_transcript_rows") == 3
    assert archived <= {m.id for m in store.messages("s_compact")}  # a dry run only counts
    report = run_retention(w.stores(), POLICY, now=now)
    assert _count(report, "archived_transcript_rows") == 3

    left = store.messages("s_compact")
    assert not archived & {m.id for m in left}
    assert summary.id in {m.id for m in left} and not any(m.archived for m in left)
    assert [m.content for m in left if m.role == "user"][-1].startswith("a live row")
    assert owed.id in {m.id for m in left}
    # The conversation goes on: a turn reads the summary, folds the owed result once.
    start = begin(store, "s_compact")
    assert [m.id for m in start.taken] == [owed.id]
    assert summary.id in {m.id for m in start.history}
    # Far later still: nothing archived is left, the summary and live rows stay.
    again = run_retention(w.stores(), POLICY, now=_aged(w, 400))
    assert _count(again, "archived_transcript_rows") == 0
    assert {m.id for m in store.messages("s_compact")} >= {summary.id, owed.id}


def test_stored_responses_go_with_their_events_never_queued_or_running(w: World) -> None:
    responses = w.location.open_responses()
    try:
        started = w.clock()
        events = [("response.created", "{}"), ("response.queued", "{}")]
        for rid, status in (("resp_done", "queued"), ("resp_q", "queued"), ("resp_r", "queued")):
            responses.insert(_response(rid, status, started), events)
        ended = Change("completed", "{}", completed_at=started, notified=True)
        assert responses.transition(
            "resp_done",
            expect=("queued",),
            owner=None,
            change=ended,
            events=[("response.completed", "{}")],
            check_owner=False,
        )
        running = Change("in_progress", "{}", owner="a-server", lease_until=started + 30)
        assert responses.transition(
            "resp_r", expect=("queued",), owner=None, change=running, check_owner=False
        )
        unnotified = Change("failed", "{}", completed_at=started)  # its webhook not sent yet
        responses.insert(_response("resp_owed", "queued", started), [])
        assert responses.transition(
            "resp_owed", expect=("queued",), owner=None, change=unnotified, check_owner=False
        )
        stores = replace(w.stores(), responses=responses)

        policy = replace(POLICY, response_days=30)
        young = run_retention(stores, policy, now=_aged(w, 29))
        assert _count(young, "stored_responses") == 0
        now = _aged(w, 31)
        assert _count(run_retention(stores, policy, now=now, dry_run=True), "stored_responses") == 1
        assert responses.get("resp_done") is not None
        report = run_retention(stores, policy, now=now)
        assert _count(report, "stored_responses") == 1
        assert responses.get("resp_done") is None
        assert responses.events_after("resp_done", -1, 10) == []
        assert {r.id for r in responses.active(10)} == {"resp_q", "resp_r"}
        assert len(responses.events_after("resp_q", -1, 10)) == 2
        assert responses.get("resp_owed") is not None  # goes once its hook has run
        responses.mark_notified("resp_owed")
        assert _count(run_retention(stores, policy, now=now), "stored_responses") == 1
        assert responses.get("resp_owed") is None
        forever = run_retention(stores, replace(policy, response_days=0), now=_aged(w, 9999))
        assert _notes(forever)["stored_responses"] == "kept forever (0 days)"
        assert {r.id for r in responses.active(10)} == {"resp_q", "resp_r"}
    finally:
        responses.close()


def _response(rid: str, status: str, at: float) -> ResponseRow:
    return ResponseRow(rid, status, True, "sess_" + rid, "{}", "{}", at, at)


def test_zero_days_keeps_a_kind_forever(w: World) -> None:
    finished_row(w.ledger, "deleg_forever")
    _deliver(w.ledger, "deleg_forever")
    report = run_retention(w.stores(), replace(POLICY, settled_days=0), now=_aged(w, 9999))
    assert _count(report, "settled_ledger_rows") == 0
    assert w.ledger.get("deleg_forever") is not None


def test_one_server_at_a_time_holds_the_lease(w: World) -> None:
    policy = replace(POLICY, interval_seconds=600)
    first = RetentionScheduler(w.stores(), policy, holder="server-a", clock=w.clock)
    second = RetentionScheduler(w.stores(), policy, holder="server-b", clock=w.clock)
    assert first.run_once() is not None
    assert second.run_once() is None  # within the interval: server-a's turn
    w.clock.advance(601)
    assert second.run_once() is not None
    assert first.run_once() is None


def test_every_kind_has_a_setting() -> None:
    names = {f for f in RetentionPolicy.__dataclass_fields__}
    assert all(kind.setting in names for kind in KINDS)
    assert len({kind.name for kind in KINDS}) == len(KINDS)
    with pytest.raises(ValueError):
        RetentionPolicy(settled_days=-1)


# --------------------------------------------------------------------------- SQLite files


def _file_size(path: Path) -> int:
    return path.stat().st_size + (
        Path(f"{path}-wal").stat().st_size if Path(f"{path}-wal").exists() else 0
    )


def test_sqlite_files_shrink_after_a_prune(tmp_path: Path) -> None:
    home = tmp_path / "home"
    location = storage.open_storage(f"sqlite://{home}")
    clock = FakeClock()
    backend = location.open_ledger()
    sessions = location.open_sessions(clock=clock)
    webui = location.open_webui()
    ledger = Ledger(backend, clock=clock, monotonic=clock.monotonic)
    big = "x" * 2000
    try:
        for n in range(600):
            finished_row(ledger, f"deleg_{n:04d}", summary=big)
            _deliver(ledger, f"deleg_{n:04d}")
            webui.append_event("delivery", json.dumps({"text": big}), clock())
            run_sync(
                sessions.aappend_turn(
                    f"s_{n}",
                    [NewMessage.build({"role": "user", "content": "hi"})],
                    create=NewSession(),
                    idempotency_key=f"idem_{n}",
                    response_json=json.dumps({"text": big}),
                )
            )
        location.reclaim_space()  # a checkpoint: the rows are in the files themselves
        files = ("ledger.db", "webui.db", "sessions.db")
        before = {name: (home / name).stat().st_size for name in files}
        stores = RetentionStores(backend, sessions, webui, reclaim=location.reclaim_space)
        report = run_retention(stores, POLICY, now=clock() + 31 * DAY)
        assert _count(report, "settled_ledger_rows") == 600
        assert _count(report, "webui_events") == 600
        assert _count(report, "idempotency_records") == 600
        after = {name: (home / name).stat().st_size for name in files}
        for name in ("ledger.db", "webui.db"):
            assert after[name] < before[name] / 4, (name, before[name], after[name])
        # The sessions and their transcripts stay: only the records' share goes.
        assert after["sessions.db"] < before["sessions.db"] / 2, (before, after)
        assert {s.path.rsplit("/", 1)[-1] for s in report.space} == set(files)
    finally:
        webui.close()
        sessions.close()
        backend.close()


def test_an_older_file_is_upgraded_and_switched_to_incremental_vacuum(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    location = storage.sqlite_files(ledger=path)
    location.open_ledger().close()
    # As a build before retention left it: schema 1, no tombstones, no incremental vacuum.
    raw = sqlite3.connect(path, isolation_level=None)
    raw.executescript(
        "DROP TABLE delivery_tombstones; DROP TABLE leases; DROP INDEX ix_settled;"
        "PRAGMA user_version = 1; PRAGMA auto_vacuum = NONE; VACUUM;"
    )
    assert raw.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    raw.close()

    backend = location.open_ledger()  # opens, gains the v3 tables
    try:
        assert backend.pruned("deleg_x") is None
        assert backend.take_lease("retention", "me", 0.0, 60.0)
    finally:
        backend.close()
    (report,) = location.reclaim_space(convert=False)
    assert report.needs_conversion and not report.converted
    (report,) = location.reclaim_space(convert=True)
    assert report.converted and not report.needs_conversion
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    raw.close()


def test_new_files_are_born_with_incremental_vacuum(tmp_path: Path) -> None:
    location = storage.open_storage(f"sqlite://{tmp_path}")
    location.open_ledger().close()
    location.open_sessions().close()
    location.open_webui().close()
    for name in ("ledger.db", "sessions.db", "webui.db"):
        raw = sqlite3.connect(tmp_path / name)
        assert raw.execute("PRAGMA auto_vacuum").fetchone()[0] == 2, name
        raw.close()


# --------------------------------------------------------------------------- helpers


def _count(report: PruneReport, kind: str) -> int:
    (found,) = [k for k in report.kinds if k.kind == kind]
    return found.count


def _notes(report: PruneReport) -> dict[str, str]:
    return {k.kind: k.note for k in report.kinds if k.note}


def test_the_scheduler_prunes_off_the_event_loop_and_stops(w: World) -> None:
    finished_row(w.ledger, "deleg_sched")
    _deliver(w.ledger, "deleg_sched")
    aged = FakeClock(w.clock() + 31 * DAY)
    scheduler = RetentionScheduler(
        w.stores(), POLICY, holder="server-a", first_delay_seconds=0, clock=aged
    )

    async def run() -> None:
        scheduler.start()
        for _ in range(500):
            if scheduler.runs:
                break
            await asyncio.sleep(0.01)
        await scheduler.aclose()

    asyncio.run(run())
    assert scheduler.runs == 1 and scheduler.last is not None
    assert w.ledger.get("deleg_sched") is None and w.ledger.pruned("deleg_sched") is not None


def test_a_stopping_server_prunes_no_further(w: World) -> None:
    finished_row(w.ledger, "deleg_stop")
    _deliver(w.ledger, "deleg_stop")
    stop = threading.Event()
    stop.set()
    report = run_retention(w.stores(), POLICY, now=_aged(w, 400), stop=stop)
    assert report.total == 0 and w.ledger.get("deleg_stop") is not None
    assert _notes(report)["settled_ledger_rows"] == "not reached: stopping"
