"""Conformance of the Responses API's stores (SQLite, memory, PostgreSQL): rows written once
per idempotency key, compare-and-set transitions fenced by the owner, events numbered in
order by whoever appends, retention that never touches queued or running rows, pokes."""

from __future__ import annotations

import json
import select
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from delivery.responses_backend import (
    Change,
    QueueCaps,
    QueueFull,
    ResponseRow,
    ResponsesBackend,
    is_storing,
    storing_owner,
)
from storage.responses_sql import DDL
from storage.sqlite.responses import SqliteResponses
from tests.api_server.test_responses import responses_backend

BACKENDS = ("sqlite", "memory", "postgres")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ResponsesBackend]:
    store = responses_backend(str(request.param), tmp_path)
    yield store
    store.close()


def row(rid: str, status: str = "queued", **kw: object) -> ResponseRow:
    values: dict[str, object] = {
        "id": rid,
        "status": status,
        "background": True,
        "session_id": "sess_1",
        "request": "{}",
        "body": json.dumps({"status": status}),
        "created_at": 100.0,
        "updated_at": 100.0,
    }
    values.update(kw)
    return ResponseRow(**values)  # type: ignore[arg-type]


def test_insert_get_and_idempotency_key(backend: ResponsesBackend) -> None:
    first = backend.insert(row("resp_a", idempotency_key="client:k"), [("response.created", "{}")])
    assert backend.get("resp_a") == first
    again = backend.insert(row("resp_b", idempotency_key="client:k"), [])
    assert again.id == "resp_a" and backend.get("resp_b") is None
    assert [(e.seq, e.type) for e in backend.events_after("resp_a", -1, 10)] == [
        (0, "response.created")
    ]


def test_transitions_are_compare_and_set_fenced_by_the_owner(backend: ResponsesBackend) -> None:
    backend.insert(row("resp_a"), [])
    claim = Change("in_progress", "{}", owner="A", lease_until=500.0)
    assert backend.transition(
        "resp_a", expect=("queued",), owner=None, change=claim, check_owner=False
    )
    # A second claimer finds it taken.
    assert not backend.transition(
        "resp_a", expect=("queued",), owner=None, change=claim, check_owner=False
    )
    assert backend.get("resp_a").owner == "A"  # type: ignore[union-attr]
    assert backend.append_events("resp_a", "A", [("d", '{"n":1}'), ("d", '{"n":2}')])
    assert not backend.append_events("resp_a", "B", [("d", "{}")])  # not B's
    assert backend.renew("resp_a", "A", 900.0) and not backend.renew("resp_a", "B", 900.0)
    done = Change("completed", '{"status":"completed"}', completed_at=200.0)
    assert not backend.transition("resp_a", expect=("in_progress",), owner="B", change=done)
    assert backend.transition(
        "resp_a", expect=("in_progress",), owner="A", change=done, events=[("end", "{}")]
    )
    found = backend.get("resp_a")
    assert found is not None and found.status == "completed" and found.completed_at == 200.0
    assert not backend.append_events("resp_a", "A", [("late", "{}")])  # ended: fenced
    assert not backend.renew("resp_a", "A", 999.0)
    events = backend.events_after("resp_a", -1, 10)
    assert [(e.seq, e.type) for e in events] == [(0, "d"), (1, "d"), (2, "end")]
    assert [e.seq for e in backend.events_after("resp_a", 0, 1)] == [1]


def test_retention_never_prunes_queued_or_running(backend: ResponsesBackend) -> None:
    backend.insert(row("resp_q"), [("e", "{}")])
    backend.insert(row("resp_r", "in_progress", owner="A"), [("e", "{}")])
    backend.insert(row("resp_old"), [("e", "{}")])
    backend.transition(
        "resp_old",
        expect=("queued",),
        owner=None,
        change=Change("cancelled", "{}", completed_at=100.0),
        check_owner=False,
    )
    backend.insert(row("resp_new"), [])
    backend.transition(
        "resp_new",
        expect=("queued",),
        owner=None,
        change=Change("completed", "{}", completed_at=300.0),
        check_owner=False,
    )
    assert [r.id for r in backend.unnotified(10)] == ["resp_old", "resp_new"]
    backend.mark_notified("resp_old")
    assert [r.id for r in backend.unnotified(10)] == ["resp_new"]
    assert backend.prune(200.0, 10) == 1
    assert backend.get("resp_old") is None and backend.events_after("resp_old", -1, 9) == []
    assert {r.id for r in backend.active(10)} == {"resp_q", "resp_r"}
    assert backend.prune(10_000.0, 10) == 0  # resp_new's hook has not run: still owed
    backend.mark_notified("resp_new")
    assert backend.prune(10_000.0, 10, dry_run=True) == 1
    assert backend.get("resp_new") is not None  # a dry run only counts
    assert backend.prune(10_000.0, 10) == 1  # resp_new; never the active ones
    assert {r.id for r in backend.active(10)} == {"resp_q", "resp_r"}
    assert backend.delete("resp_q") and not backend.delete("resp_q")
    assert backend.events_after("resp_q", -1, 9) == []


def test_concurrent_appenders_never_share_a_number(backend: ResponsesBackend) -> None:
    backend.insert(row("resp_a", "in_progress", owner="A"), [])
    errors: list[BaseException] = []

    def append() -> None:
        try:
            for _ in range(20):
                backend.append_events("resp_a", "A", [("d", "{}")])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=append) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [e.seq for e in backend.events_after("resp_a", -1, 100)] == list(range(60))


def test_a_write_pokes_the_subscribers(backend: ResponsesBackend) -> None:
    sub = backend.notifier.subscribe()
    assert sub is not None
    try:
        backend.notifier.notify()
        readable, _, _ = select.select([sub.fileno()], [], [], 10)
        assert readable
        sub.drain()
    finally:
        sub.close()


def test_the_sqlite_file_is_versioned(tmp_path: Path) -> None:
    responses_backend("sqlite", tmp_path).close()
    with sqlite3.connect(tmp_path / "responses.db") as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
    (tmp_path / "other.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(Exception, match="not a SQLite database"):
        from storage import sqlite_files

        sqlite_files(responses=tmp_path / "other.db").open_responses()


def test_status_counts_count_every_stored_response_by_status(backend: ResponsesBackend) -> None:
    assert backend.status_counts() == {}
    for rid, status in [("r1", "queued"), ("r2", "queued"), ("r3", "completed")]:
        backend.insert(row(rid, status), [])
    backend.insert(row("r4", "failed", completed_at=101.0), [])
    claim = Change("in_progress", "{}", owner="A", lease_until=500.0)
    assert backend.transition("r1", expect=("queued",), owner=None, change=claim, check_owner=False)
    assert backend.status_counts() == {"queued": 1, "in_progress": 1, "completed": 1, "failed": 1}


def test_queued_counts_all_and_the_callers_own(backend: ResponsesBackend) -> None:
    backend.insert(row("resp_a", caller="key:a"), [])
    backend.insert(row("resp_b", caller="key:a"), [])
    backend.insert(row("resp_c", caller="key:b"), [])
    backend.insert(row("resp_d", "in_progress", caller="key:a"), [])  # running: not queued
    assert backend.queued("key:a") == (3, 2)
    assert backend.queued("key:z") == (3, 0)
    found = backend.get("resp_a")
    assert found is not None and found.caller == "key:a"


def test_an_insert_beyond_the_queue_caps_is_refused_but_a_repeat_is_answered(
    backend: ResponsesBackend,
) -> None:
    caps = QueueCaps(per_caller=2, total=3)
    backend.insert(row("resp_a", caller="key:a", idempotency_key="client:a"), [], caps)
    backend.insert(row("resp_b", caller="key:a"), [], caps)
    with pytest.raises(QueueFull) as own:
        backend.insert(row("resp_c", caller="key:a"), [], caps)
    assert own.value.per_key and backend.get("resp_c") is None
    again = backend.insert(row("resp_d", caller="key:a", idempotency_key="client:a"), [], caps)
    assert again.id == "resp_a"  # the repeat of an accepted one
    backend.insert(row("resp_e", caller="key:b"), [], caps)
    with pytest.raises(QueueFull) as total:
        backend.insert(row("resp_f", caller="key:c"), [], caps)
    assert not total.value.per_key
    backend.insert(row("resp_g", "in_progress", caller="key:c"), [], None)  # not queued: no cap
    assert backend.queued("key:a") == (3, 2)


def test_a_storing_run_still_appends_and_renews_and_a_cancel_by_the_old_owner_fails(
    backend: ResponsesBackend,
) -> None:
    backend.insert(row("resp_a", "in_progress", owner="A", lease_until=500.0), [])
    storing = Change("in_progress", "{}", owner=storing_owner("A"), lease_until=600.0)
    assert backend.transition("resp_a", expect=("in_progress",), owner="A", change=storing)
    found = backend.get("resp_a")
    assert found is not None and is_storing(found.owner)
    # The run is still the row's: its events and its lease go on.
    assert backend.append_events("resp_a", "A", [("response.output_text.done", "{}")])
    assert backend.renew("resp_a", "A", 700.0)
    # A cancel that read the owner before the store began can no longer move the row.
    cancel = Change("cancelled", "{}", completed_at=1.0)
    assert not backend.transition("resp_a", expect=("in_progress",), owner="A", change=cancel)
    done = Change("completed", "{}", completed_at=2.0)
    assert backend.transition(
        "resp_a", expect=("in_progress",), owner=storing_owner("A"), change=done
    )


def test_a_version_1_responses_file_gains_the_caller_column(tmp_path: Path) -> None:
    path = tmp_path / "responses.db"
    old = sqlite3.connect(path)
    old.executescript(DDL + ";PRAGMA application_id = 1381126992;PRAGMA user_version = 1;")
    old.execute(
        "INSERT INTO responses (id, status, background, session_id, request, body, "
        "created_at, updated_at) VALUES ('resp_old', 'queued', 1, 's', '{}', '{}', 1, 1)"
    )
    old.commit()
    old.close()
    store = SqliteResponses(path)
    try:
        assert store.queued(None) == (1, 0)
        store.insert(row("resp_new", caller="key:a"), [])
        assert store.queued("key:a") == (2, 1)
    finally:
        store.close()
    again = SqliteResponses(path)  # opened once more: nothing left to add
    again.close()
