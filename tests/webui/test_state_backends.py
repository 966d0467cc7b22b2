"""Conformance of the web UI's state backends (SQLite, memory, PostgreSQL): the event log's
ids, its bounds and pruning, unread marks, tool steps, settings, and the pokes between the
servers that share it; ids grow in commit order even when servers append at once."""

from __future__ import annotations

import select
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from delivery.webui_state import WebUIStateBackend
from tests.stores import webui_state

BACKENDS = ("sqlite", "memory", "postgres")


@pytest.fixture(params=BACKENDS)
def state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WebUIStateBackend]:
    backend = webui_state(str(request.param), tmp_path)
    yield backend
    backend.close()


def test_events_have_growing_ids_and_replay_in_order(state: WebUIStateBackend) -> None:
    assert state.newest_event_id() == 0 and state.oldest_event_id() is None
    ids = [state.append_event("t", f'{{"n":{i}}}', 1.0) for i in range(5)]
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert state.newest_event_id() == ids[-1] and state.oldest_event_id() == ids[0]
    after = state.events_after(ids[1], 2)
    assert [(e.id, e.type, e.data_json) for e in after] == [
        (ids[2], "t", '{"n":2}'),
        (ids[3], "t", '{"n":3}'),
    ]
    state.prune_events(2)
    assert state.oldest_event_id() == ids[3]
    assert state.newest_event_id() == ids[-1]  # the newest id ever, pruned or not


def test_unread_marks_tool_steps_and_settings(state: WebUIStateBackend) -> None:
    state.set_unread("s1", True)
    state.set_unread("s2", True)
    state.set_unread("s2", False)
    assert state.unread_ids() == {"s1"}
    state.add_tool_step("s1", "turn_a", "shell", "done", "shell done in 1 s", 1.0)
    state.add_tool_step("s1", "turn_b", "shell", "failed", "shell failed", 2.0)
    state.add_tool_step("s2", "turn_c", "delegate", "done", "delegate done", 3.0)
    state.place_tool_steps("turn_a", 42)
    state.place_tool_steps("turn_b", None)  # its turn stored nothing
    steps = state.tool_steps("s1", 10)
    assert [(s.message_id, s.name, s.status) for s in steps] == [(42, "shell", "done")]
    assert state.setting("login_epoch") is None
    state.set_setting("login_epoch", "3")
    assert state.setting("login_epoch") == "3"
    assert state.setting_or_default("cookie_secret", "aa") == "aa"
    assert state.setting_or_default("cookie_secret", "bb") == "aa"  # the first one stays


def test_a_poke_reaches_every_subscriber(state: WebUIStateBackend) -> None:
    subs = [state.notifier.subscribe() for _ in range(2)]
    try:
        assert all(sub is not None for sub in subs)
        state.notifier.notify()
        for sub in subs:
            assert sub is not None
            ready, _, _ = select.select([sub.fileno()], [], [], 10)
            assert ready, "no poke arrived"
            sub.drain()
    finally:
        for sub in subs:
            if sub is not None:
                sub.close()


def test_racing_appends_are_read_in_commit_order(state: WebUIStateBackend) -> None:
    """Whatever a reader saw last, reading after it later never skips an event."""
    seen: list[int] = []
    stop = threading.Event()

    def tail() -> None:
        last = 0
        while not stop.is_set():
            for event in state.events_after(last, 100):
                seen.append(event.id)
                last = event.id

    reader = threading.Thread(target=tail)
    reader.start()
    writers = [
        threading.Thread(target=lambda: [state.append_event("t", "{}", 1.0) for _ in range(40)])
        for _ in range(4)
    ]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    reader.join()
    seen.extend(e.id for e in state.events_after(seen[-1] if seen else 0, 1000))
    assert len(seen) == 160 and seen == sorted(seen)


def test_a_deleted_webui_db_is_noticed_and_made_again(tmp_path, caplog) -> None:
    """``webui.db`` deleted while serving: every later event went to the unlinked file,
    lost to every tab and to the next start, and nothing said so. Now the backend notices
    the file is gone (or replaced), says so once, and makes it again."""
    from storage.sqlite.webui import SqliteWebUIState

    caplog.set_level("WARNING")
    path = tmp_path / "webui.db"
    state = SqliteWebUIState(path)
    try:
        first = state.append_event("note", "{}", 1.0)
        for suffix in ("", "-wal", "-shm"):
            (tmp_path / f"webui.db{suffix}").unlink(missing_ok=True)
        again = state.append_event("note", '{"n": 2}', 2.0)
        assert path.exists()
        assert [e.data_json for e in state.events_after(0, 10)] == ['{"n": 2}']
        assert again >= 1 and state.newest_event_id() == again
        warned = [r for r in caplog.records if "webui.db" in r.getMessage()]
        assert len(warned) == 1 and "made again" in warned[0].getMessage()
        state.append_event("note", "{}", 3.0)
        assert len([r for r in caplog.records if "webui.db" in r.getMessage()]) == 1
        assert first == 1
    finally:
        state.close()
