"""A schedule on PostgreSQL with three `reveille serve` processes, each with its own
REVEILLE_HOME (as on separate hosts): every occurrence is delivered once, into the
conversation's transcript once, whichever server fires it; the one that set it is SIGKILLed
while it runs and the others carry on."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from delivery.schedules import SCHEDULE_KIND
from gateway.wake import WAKEUP_DISPLAY_KIND
from tests.api_server.serve_support import Server, chat, transcript, wait_until
from tests.pg_support import fresh_url
from tests.stores import pg_ledger

_SCHEDULE_ID = re.compile(r"Schedule (sch_\w+) set")


def _server(tmp_path: Path, name: str, url: str) -> Server:
    home = tmp_path / name
    home.mkdir()
    env = {
        "REVEILLE_DATABASE_URL": url,
        "REVEILLE_PEER_TIMEOUT_SECONDS": "2",
        "REVEILLE_TIMERS_MIN_DELAY_SECONDS": "1",
    }
    return Server(home, extra_env=env)


def _occurrences(url: str, schedule_id: str) -> dict[str, str]:
    from delivery.ledger import Ledger
    from delivery.rows import RowQuery

    backend = pg_ledger(url, migrate=False)
    try:
        rows = Ledger(backend).query(RowQuery(kind=SCHEDULE_KIND, limit=1000))
    finally:
        backend.close()
    return {r.id: r.delivery_state for r in rows if r.id.startswith(schedule_id + "-")}


def test_three_servers_fire_each_occurrence_once(tmp_path: Path) -> None:
    url = fresh_url()
    servers = [_server(tmp_path, name, url) for name in ("a", "b", "c")]
    try:
        session_id, reply = chat(servers[0].port, "every 2 seconds: check the queue")
        schedule_id = _SCHEDULE_ID.search(reply).group(1)  # type: ignore[union-attr]

        def delivered() -> list[str]:
            return sorted(k for k, v in _occurrences(url, schedule_id).items() if v == "delivered")

        wait_until(lambda: len(delivered()) >= 2, timeout=30)
        servers[0].stop(signal.SIGKILL)  # the server that set it
        done = len(delivered())
        wait_until(lambda: len(delivered()) >= done + 3, timeout=40)
        fired = delivered()
        rows = [
            m
            for m in transcript(servers[1].port, session_id)
            if m["display_kind"] == WAKEUP_DISPLAY_KIND
        ]
        ids = [m["display_metadata"]["delivery_id"] for m in rows]
        assert len(ids) == len(set(ids))  # no occurrence twice in the conversation
        assert set(ids) <= set(_occurrences(url, schedule_id))
        assert set(fired) <= set(ids), (fired, ids)  # acknowledged only once it came home
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.proc.kill()
