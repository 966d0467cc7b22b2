"""A PostgreSQL connection lost to a server restart is replaced before the turn uses it.

After a graceful restart (or a failover) every pooled connection is dead, and the first
turn's write failed on one of them. The pool now checks a connection before handing it
out and replaces a dead one, so the turn after the restart goes through. The restart is
played by terminating this store's backends (named by ``application_name``, so the
shared test server's other users are untouched) from another connection.
"""

from __future__ import annotations

import secrets

import psycopg

import storage
from gateway.config import Platform
from gateway.session import SessionSource, SessionStore
from tests.pg_support import PG_URL, fresh_url
from tests.sessions._support import make_session


def _terminate(application: str) -> int:
    """Terminate the store's backends and wait until they are gone (signalled, not yet
    ended, a backend would still answer). A pool may open new ones meanwhile, under the
    same name: only those terminated must be gone."""
    query = "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        pids = {r[0] for r in conn.execute(query, (application,)).fetchall()}
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        assert pids.isdisjoint(r[0] for r in conn.execute(query, (application,)).fetchall())
    return len(pids)


async def test_a_turn_after_a_restart_is_not_lost_to_a_dead_connection() -> None:
    application = f"reveille_restart_{secrets.token_hex(4)}"
    url = f"{fresh_url()}&application_name={application}"
    located = storage.open_storage(url)
    store = SessionStore(located.open_sessions())
    try:
        source = SessionSource(platform=Platform.API_SERVER, chat_id="s1")
        make_session(store, "s1", source=source)
        store.append_message("s1", "user", "before the restart")
        assert _terminate(application) >= 1
        # The first turn after it: its write, then its reads and writes.
        store.append_message("s1", "user", "right after")
        assert _terminate(application) >= 1
        await store.aappend_turn("s1", [{"role": "user", "content": "first"}])
        start = await store.abegin_turn("s1")
        assert [m.content for m in start.history][:2] == ["before the restart", "right after"]
        await store.aappend_turn(
            "s1", [{"role": "user", "content": "after"}, {"role": "assistant", "content": "ok"}]
        )
        store.append_message("s1", "user", "and on")
        assert [m.content for m in store.messages("s1")][-3:] == ["after", "ok", "and on"]
    finally:
        store.close()


def test_a_ledger_write_after_a_restart_is_retried_once_on_a_new_connection() -> None:
    """The writer's own connections die with the restart too: the first batch after it
    failed ("nothing was written") and the dispatch or claim it carried was lost to the
    turn. Terminated by the server (AdminShutdown), nothing of it was committed, so it is
    run once more on a fresh connection."""
    from delivery.ledger import Ledger

    application = f"reveille_restart_{secrets.token_hex(4)}"
    url = f"{fresh_url()}&application_name={application}"
    backend = storage.open_storage(url).open_ledger()
    try:
        ledger = Ledger(backend)
        ledger.create("deleg_before01", kind="delegation", session_key="s")
        assert _terminate(application) >= 1
        ledger.create("deleg_after001", kind="delegation", state="running", session_key="s")
        assert ledger.get("deleg_after001") is not None
        assert _terminate(application) >= 1
        event = {"type": "async_delegation", "delegation_id": "deleg_after001"}
        assert ledger.finish("deleg_after001", expected="running", state="completed", event=event)
    finally:
        backend.close()
