"""Conformance of the Telegram state's backends (SQLite, memory, PostgreSQL), the same tests on
each: the inbox and its offset move together, an update is handed to one server once even
when servers race, claims and the polling lease have one holder (free, lapsed, own or proved
dead), replies and chat sessions, pruning, and absorbing an old ``telegram.db``."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import storage
from delivery.identity import current_identity
from delivery.telegram_backend import (
    TelegramBackend,
    TelegramDump,
    TelegramDumpChat,
    TelegramDumpDone,
    TelegramDumpInbox,
    TelegramDumpPart,
)
from gateway.surfaces.telegram.state import TelegramState
from tests.pg_support import fresh_url
from tests.telegram.legacy_file import make_legacy_file

BACKENDS = ("sqlite", "memory", "postgres")
A, B = "host-a|boot|1|1", "host-b|boot|2|2"


@pytest.fixture(params=BACKENDS)
def opener(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[], TelegramBackend]]:
    """Opens backends on ONE store, as several servers do (memory: the one instance)."""
    kind = str(request.param)
    opened: list[TelegramBackend] = []
    if kind == "sqlite":
        location = storage.sqlite_files(chats=tmp_path / "chats.db")
    elif kind == "postgres":
        location = storage.open_storage(fresh_url())
    else:
        location = storage.open_storage("memory://telegram")
    shared = location.open_telegram() if kind == "memory" else None

    def open_one() -> TelegramBackend:
        backend = shared or location.open_telegram()
        opened.append(backend)
        return backend

    yield open_one
    for backend in opened:
        backend.close()


@pytest.fixture
def store(opener: Callable[[], TelegramBackend]) -> TelegramBackend:
    return opener()


def _take(store: TelegramBackend, ids: list[int], holder: str = A, **kw) -> list[int]:
    pairs = [(i, json.dumps({"update_id": i})) for i in ids]
    return store.take_updates("bot", pairs, holder=holder, now=100.0, claim_seconds=10.0, **kw)


def test_updates_and_the_offset_move_together_and_only_forward(store: TelegramBackend) -> None:
    assert store.next_offset("bot") is None
    assert _take(store, [5, 7]) == [5, 7]
    assert store.next_offset("bot") == 8
    assert _take(store, [5, 7]) == []  # handed out twice: taken once
    assert _take(store, [3]) == [3]
    assert store.next_offset("bot") == 8  # never back
    assert _take(store, [9], move_offset=False) == [9]  # a webhook update
    assert store.next_offset("bot") == 8
    assert store.next_offset("other") is None
    rows = store.unanswered("bot")
    assert [(r.update_id, r.holder, r.claimed_until) for r in rows] == [
        (3, A, 110.0),
        (5, A, 110.0),
        (7, A, 110.0),
        (9, A, 110.0),
    ]
    assert json.loads(rows[1].payload_json) == {"update_id": 5}
    store.mark_answered("bot", 5, now=101.0)
    assert [r.update_id for r in store.unanswered("bot")] == [3, 7, 9]


def test_a_claim_has_one_holder_until_it_lapses_or_its_holder_is_dead(
    store: TelegramBackend,
) -> None:
    _take(store, [1])
    claim = store.claim
    assert not claim("bot", 1, B, now=105.0, claim_seconds=10.0)  # A holds it
    assert claim("bot", 1, A, now=105.0, claim_seconds=10.0)  # its own: renewed to 115
    assert not claim("bot", 1, B, now=112.0, claim_seconds=10.0)
    assert claim("bot", 1, B, now=112.0, claim_seconds=10.0, dead_holder=A)  # proved dead
    assert [r.holder for r in store.unanswered("bot")] == [B]
    assert store.renew_claims("bot", B, now=130.0, claim_seconds=10.0) == 1
    assert not claim("bot", 1, A, now=135.0, claim_seconds=10.0)
    assert claim("bot", 1, A, now=140.0, claim_seconds=10.0)  # lapsed at 140
    store.mark_answered("bot", 1, now=141.0)
    assert not claim("bot", 1, B, now=500.0, claim_seconds=10.0)  # answered: nobody's
    assert not claim("bot", 99, B, now=500.0, claim_seconds=10.0)  # no such update
    assert store.renew_claims("bot", A, now=500.0, claim_seconds=10.0) == 0


def test_the_polling_lease_has_one_holder(store: TelegramBackend) -> None:
    assert store.poll_lease("bot") is None
    assert store.take_poll_lease("bot", A, now=100.0, ttl_seconds=6.0)
    assert not store.take_poll_lease("bot", B, now=103.0, ttl_seconds=6.0)
    assert store.take_poll_lease("bot", A, now=103.0, ttl_seconds=6.0)  # renewed to 109
    assert not store.take_poll_lease("bot", B, now=108.0, ttl_seconds=6.0)
    lease = store.poll_lease("bot")
    assert lease is not None and (lease.holder, lease.expires_at) == (A, 109.0)
    assert store.take_poll_lease("bot", B, now=108.0, ttl_seconds=6.0, dead_holder=A)
    assert not store.take_poll_lease("bot", A, now=110.0, ttl_seconds=6.0)
    store.release_poll_lease("bot", A)  # not A's: nothing happens
    assert store.poll_lease("bot") is not None
    store.release_poll_lease("bot", B)
    assert store.poll_lease("bot") is None
    assert store.take_poll_lease("bot", A, now=111.0, ttl_seconds=6.0)
    assert store.take_poll_lease("other", B, now=111.0, ttl_seconds=6.0)  # per bot


def test_servers_racing_hand_each_update_out_once_and_one_takes_the_lease(
    opener: Callable[[], TelegramBackend],
) -> None:
    stores = [opener() for _ in range(4)]
    won: list[list[int]] = [[] for _ in stores]
    leases: list[bool] = [False for _ in stores]
    start = threading.Barrier(len(stores))

    def race(i: int) -> None:
        start.wait()
        holder = f"h{i}"
        leases[i] = stores[i].take_poll_lease("bot", holder, now=100.0, ttl_seconds=6.0)
        for n in range(0, 40, 4):
            won[i] += _take(stores[i], list(range(n, n + 4)), holder=holder)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(u for w in won for u in w) == list(range(40))
    assert sum(leases) == 1
    assert stores[0].next_offset("bot") == 40


def test_replies_and_chat_sessions(store: TelegramBackend) -> None:
    assert store.reply_parts("k") == {}
    store.record_part("k", 0, "1", 99)
    store.record_part("k", 1, "1", 100)
    store.record_part("k", 1, "1", 101)  # sent again: the newest message
    assert store.reply_parts("k") == {0: 99, 1: 101}
    assert not store.reply_finished("k")
    store.finish_reply("k", now=100.0)
    store.finish_reply("k", now=200.0)
    assert store.reply_finished("k")
    assert store.chat_session("chat") is None
    store.start_chat_session("chat", "s1", now=1.0)
    store.start_chat_session("chat", "s2", now=2.0)
    assert store.chat_session("chat") == "s2"


def test_prune_forgets_only_what_is_answered_or_finished_and_old(store: TelegramBackend) -> None:
    _take(store, [1, 2, 3])
    store.mark_answered("bot", 1, now=50.0)
    store.mark_answered("bot", 2, now=500.0)
    store.record_part("old", 0, "1", 1)
    store.finish_reply("old", now=50.0)
    store.record_part("new", 0, "1", 2)
    store.finish_reply("new", now=500.0)
    store.record_part("open", 0, "1", 3)
    store.prune(before=100.0)
    assert [r.update_id for r in store.unanswered("bot")] == [3]
    assert _take(store, [1, 2]) == [1]  # 1 was forgotten, 2 is still known
    assert store.reply_parts("old") == {} and not store.reply_finished("old")
    assert store.reply_parts("new") == {0: 2} and store.reply_finished("new")
    assert store.reply_parts("open") == {0: 3}


def test_absorbing_a_dump_keeps_what_the_store_has(store: TelegramBackend) -> None:
    _take(store, [10])
    store.start_chat_session("chat", "mine", now=1.0)
    dump = TelegramDump(
        offsets={"bot": 9, "b2": 4},
        inbox=[
            TelegramDumpInbox("bot", 8, '{"update_id": 8}', 1.0, None),
            TelegramDumpInbox("bot", 7, '{"update_id": 7}', 1.0, 2.0),
            TelegramDumpInbox("bot", 10, '{"update_id": 10, "old": 1}', 1.0, None),
        ],
    )
    dump.parts.append(TelegramDumpPart("k", 0, "1", 5))
    dump.done.append(TelegramDumpDone("k", 3.0))
    dump.chats += [TelegramDumpChat("chat", "theirs", 0.5), TelegramDumpChat("c2", "s", 0.5)]
    for _ in range(2):
        store.absorb(dump)
    assert store.next_offset("bot") == 11 and store.next_offset("b2") == 4
    rows = store.unanswered("bot")
    assert [(r.update_id, r.holder) for r in rows] == [(8, None), (10, A)]
    assert json.loads(rows[1].payload_json) == {"update_id": 10}
    assert store.reply_parts("k") == {0: 5} and store.reply_finished("k")
    assert store.chat_session("chat") == "mine" and store.chat_session("c2") == "s"


def test_the_face_hands_orphans_out_once_and_skips_its_own(
    opener: Callable[[], TelegramBackend],
) -> None:
    """``TelegramState``: updates of a dead server (and unclaimed ones) are taken over by the
    first server that looks; its own, in hand already, are never handed out twice."""
    dead = "somewhere|boot|1|1"  # another host: judged by its lapsed claim
    one = TelegramState(opener(), holder="one|x|1|1", lease_seconds=6.0)
    two = TelegramState(opener(), holder="two|x|2|2", lease_seconds=6.0)
    one.backend.take_updates(
        "bot", [(1, '{"update_id": 1}')], holder=dead, now=0.0, claim_seconds=1.0
    )
    taken = one.take_updates("bot", [{"update_id": 2}, {"update_id": "x"}])
    assert [u for u, _ in taken] == [2]
    assert one.claim_orphans("bot", in_hand={2}) == [(1, {"update_id": 1})]
    assert one.claim_orphans("bot", in_hand={1, 2}) == []  # its own, being answered
    assert two.claim_orphans("bot") == []  # one lives and holds both
    # Its own, stored but never handed out (its intake was cancelled): handed out again.
    assert one.claim_orphans("bot", in_hand={2}) == [(1, {"update_id": 1})]
    assert one.hold_poll_lease("bot") and not two.hold_poll_lease("bot")
    one.release_poll_lease("bot")
    assert two.hold_poll_lease("bot")


def test_a_dead_process_of_this_host_loses_its_claims_and_lease_at_once(
    opener: Callable[[], TelegramBackend],
) -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    me = current_identity()
    gone = f"{me.host}|{me.boot_id}|{child.pid}|1"  # proved dead by /proc, not by time
    backend = opener()
    now = time.time()
    backend.take_updates("bot", [(1, "{}")], holder=gone, now=now, claim_seconds=3600.0)
    assert backend.take_poll_lease("bot", gone, now=now, ttl_seconds=3600.0)
    state = TelegramState(backend, holder="heir|x|1|1")
    assert state.claim_orphans("bot") == [(1, {})]
    assert state.hold_poll_lease("bot")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_an_old_telegram_db_is_absorbed_once_and_renamed(tmp_path: Path, kind: str) -> None:
    """The file the adapter kept before its state moved into the store (schema 2, as the
    old code made it): every row comes over (into ``chats.db``, or the database), the file
    is renamed ``.migrated``, and a second start finds nothing to do."""
    old = tmp_path / "telegram.db"
    make_legacy_file(
        old,
        """
        INSERT INTO offsets VALUES ('123456', 1006);
        INSERT INTO inbox VALUES ('123456', 1004, '{"update_id": 1004}', 1.0, 2.0);
        INSERT INTO inbox VALUES ('123456', 1005, '{"update_id": 1005}', 1.0, NULL);
        INSERT INTO reply_parts VALUES ('telegram:123456:update:1004', 0, '42', 7);
        INSERT INTO replies_done VALUES ('telegram:123456:update:1004', 3.0);
        INSERT INTO chat_sessions VALUES ('agent:main:telegram:dm:42', 'fresh-session', 4.0);
        """,
    )
    url = f"sqlite://{tmp_path / 'home'}" if kind == "sqlite" else fresh_url()
    location = storage.open_storage(url)
    backend = location.open_telegram(legacy_file=old)
    try:
        assert not old.exists() and (tmp_path / "telegram.db.migrated").is_file()
        assert backend.next_offset("123456") == 1006
        assert [(r.update_id, r.holder) for r in backend.unanswered("123456")] == [(1005, None)]
        assert backend.reply_parts("telegram:123456:update:1004") == {0: 7}
        assert backend.reply_finished("telegram:123456:update:1004")
        assert backend.chat_session("agent:main:telegram:dm:42") == "fresh-session"
    finally:
        backend.close()
    again = location.open_telegram(legacy_file=old)  # nothing there any more
    try:
        assert again.next_offset("123456") == 1006
    finally:
        again.close()
    if kind == "postgres":
        assert sorted(p.name for p in tmp_path.iterdir()) == ["telegram.db.migrated"]


def test_a_foreign_file_named_telegram_db_is_refused_untouched(tmp_path: Path) -> None:
    old = tmp_path / "telegram.db"
    sqlite3.connect(old).execute("CREATE TABLE t (x)").connection.close()
    location = storage.open_storage("memory://t")
    with pytest.raises(RuntimeError, match="not a Reveille Telegram state file"):
        location.open_telegram(legacy_file=old)
    assert old.is_file()
