"""Helpers shared by the session-store tests: the backends, and a delivery row to fold."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from delivery.session_backend import MessageRecord, SessionBackend, SessionState, TurnStart
from gateway.session import SessionGone, SessionRecord, SessionSource, SessionStore
from tests.pg_support import fresh_url
from tests.stores import memory_sessions, pg_sessions, sqlite_sessions

BACKENDS = ("sqlite", "memory", "postgres")


def make_backend(kind: str, directory: Path) -> SessionBackend:
    if kind == "sqlite":
        return sqlite_sessions(directory / "sessions.db")
    if kind == "memory":
        return memory_sessions()
    if kind == "postgres":
        return pg_sessions(fresh_url())
    raise AssertionError(f"unknown backend {kind!r}")


def delivery(store: SessionStore, sid: str, n: int) -> MessageRecord:
    """A completion's delivery row (what ``gateway.wake`` appends), dedupe key ``deleg:<n>``."""
    return store.append_message(
        sid,
        "system",
        f"delivery {n}",
        display_kind="async_delegation_complete",
        display_metadata={"n": n},
        dedupe_key=f"deleg:{n}",
    )


T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a store coroutine to its end from synchronous test code (on a loop of its own in
    another thread, so a caller already inside an event loop may use it too)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def make_session(
    store: SessionStore,
    session_id: str | None = None,
    *,
    source: SessionSource | None = None,
    title: str | None = None,
    exclusive: bool = False,
) -> SessionRecord:
    """Create a session from synchronous test code through the store's public coroutine
    (``acreate_session``, what every surface calls)."""
    return run_sync(
        store.acreate_session(session_id, source=source, title=title, exclusive=exclusive)
    )


def append_turn(
    store: SessionStore, sid: str, messages: Sequence[Mapping[str, Any]], **options: Any
) -> list[MessageRecord]:
    """Store a turn from synchronous test code through the store's one way to
    (``aappend_turn``), and read back the rows it added (a repeated dedupe key adds none)."""
    try:
        last = max((m.id for m in store.latest_messages(sid, limit=1)), default=0)
    except SessionGone:
        last = 0
    run_sync(store.aappend_turn(sid, messages, **options))
    return store.messages(sid, after_id=last)


def begin(store: SessionStore, sid: str) -> TurnStart:
    """What a turn that starts now finds (``abegin_turn``: it folds what waits)."""
    return run_sync(store.abegin_turn(sid))


def take_unfolded(store: SessionStore, sid: str) -> list[dict[str, Any]]:
    """The delivery rows a turn starting now folds, as dicts: each row reaches exactly one
    turn. SessionGone when the session is not live, as a turn of it would be refused."""
    start = begin(store, sid)
    if start.state != "live":
        raise SessionGone(sid)
    return [m.as_dict() for m in start.taken]


def state_of(store: SessionStore, sid: str) -> SessionState:
    """The session's state as a turn starting now finds it (live, unknown or deleted)."""
    return begin(store, sid).state


def writes(store: SessionStore) -> int:
    """Committed write operations so far: reads must leave this alone."""
    return store.backend.stats()["writes"]


def race(stores: list[SessionStore], sid: str, total: int, threads: int) -> list[int]:
    """One thread appends ``total`` delivery rows while the others fold; the ids taken."""
    taken: list[int] = []
    taken_lock = threading.Lock()
    start = threading.Barrier(threads + 1)
    done_writing = threading.Event()

    def writer() -> None:
        start.wait()
        for n in range(total):
            delivery(stores[0], sid, n)
        done_writing.set()

    def reader(s: SessionStore) -> None:
        start.wait()
        while True:
            finished = done_writing.is_set()
            got = take_unfolded(s, sid)
            with taken_lock:
                taken.extend(m["id"] for m in got)
            if finished and not got:
                return

    workers = [threading.Thread(target=writer)]
    workers += [
        threading.Thread(target=reader, args=(stores[i % len(stores)],)) for i in range(threads - 1)
    ]
    for w in workers:
        w.start()
    start.wait()
    for w in workers:
        w.join(timeout=60)
    assert not any(w.is_alive() for w in workers)
    return taken
