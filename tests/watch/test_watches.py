"""Watches in one process over a real ledger (SQLite file, memory, PostgreSQL when there is
one), with real background processes and real interval commands; no model anywhere.

- an output pattern fires once (default ``max_fires``) however often it matches, and with
  ``max_fires=2`` its second firing waits out the cooldown;
- a process that exits unmatched ends its watch visibly (an ``ended`` wake-up);
- an interval command fires when it starts exiting 0, once;
- a lifetime that runs out ends the watch visibly (an ``expired`` wake-up);
- a cancel stops it: nothing fires afterwards;
- a watch adopted from a dead server keeps its count: a firing written before the crash is
  not written again.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from delivery.backend import LedgerStore
from delivery.events import SCHEDULED_WAKEUP, WATCH_FIRE_KIND, WATCH_KIND
from delivery.ledger import Ledger
from delivery.rows import LedgerRow, RowQuery
from tests.delivery._support import exited_identity
from tests.pg_support import fresh_url
from tests.stores import memory_ledger, pg_ledger, sqlite_ledger
from tests.tools.test_process_adoption import wait_for as _wait_for
from tools.background_processes import ProcessRegistry
from tools.completion_queue import CompletionQueue
from tools.delegation_runtime import DelegationRuntime
from tools.watch_rules import WatchOrigin, WatchSpec, parse_watch
from tools.watches import WatchManager

WAIT = 20.0
wait_for = functools.partial(_wait_for, timeout=WAIT)
ORIGIN = WatchOrigin(session_key="agent:main:api:dm:s1", origin_session_id="s1")


class Server:
    """One server: a runtime over the shared ledger, its processes and its watches."""

    def __init__(self, backend: LedgerStore, home: Path, identity: str | None = None) -> None:
        self.runtime = DelegationRuntime(Ledger(backend, identity=identity), CompletionQueue())
        self.registry = ProcessRegistry(CompletionQueue(), runtime=lambda: self.runtime)
        self.registry.attach(self.runtime.ledger, directory=home / "processes")
        self.watches = WatchManager(
            runtime=lambda: self.runtime, processes=lambda: self.registry, poll_seconds=0.05
        )
        self.watches.attach(self.runtime.ledger, shell_enabled=True, workdir=str(home))

    @property
    def ledger(self) -> Ledger:
        return self.runtime.ledger

    def watch(self, watch_id: str, **args: Any) -> WatchSpec:
        spec = parse_watch({"note": "check it", **args}, time.time(), min_interval_seconds=0.1)
        self.watches.create(watch_id, spec, ORIGIN)
        return spec

    def fires(self, watch_id: str) -> list[LedgerRow]:
        rows = self.ledger.query(RowQuery(kind=WATCH_FIRE_KIND, limit=100))
        return sorted((r for r in rows if r.id.startswith(watch_id + ".")), key=lambda r: r.id)

    def ended(self, watch_id: str) -> LedgerRow | None:
        row = self.ledger.get(watch_id)
        return row if row is not None and row.state != "running" else None

    def close(self) -> None:
        self.watches.detach()
        for info in self.registry.list_running():
            with contextlib.suppress(OSError):
                os.killpg(info["pid"], signal.SIGKILL)
        self.runtime.close()


def _sqlite(tmp_path: Path) -> LedgerStore:
    return sqlite_ledger(str(tmp_path / "ledger.db"))


def _memory(tmp_path: Path) -> LedgerStore:
    return memory_ledger()


def _postgres(tmp_path: Path) -> LedgerStore:
    return pg_ledger(fresh_url())


@pytest.fixture(params=[_sqlite, _memory, _postgres], ids=["sqlite", "memory", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    made = Server(request.param(tmp_path), tmp_path)
    yield made
    made.close()


def _printer(lines: list[str], *, gap: float, then_sleep: float = 0.0) -> str:
    """A shell command that prints ``lines`` ``gap`` seconds apart, then sleeps."""
    body = "; ".join(
        f"import time; print({line!r}, flush=True); time.sleep({gap})" for line in lines
    )
    return f'{sys.executable} -c "{body}; time.sleep({then_sleep})"'


def test_an_output_pattern_fires_once_however_often_it_matches(server: Server) -> None:
    command = _printer(["starting", "build FAILED: step 1", "build FAILED: step 2"], gap=0.2)
    proc = server.registry.spawn(command, session_key=ORIGIN.session_key, notify_on_complete=False)
    server.watch("watch_a", process_id=proc["process_id"], pattern=r"FAILED: step \d")

    ended = wait_for(lambda: server.ended("watch_a"))
    [fire] = server.fires("watch_a")
    assert fire.event is not None and fire.event["type"] == SCHEDULED_WAKEUP
    assert fire.event["matched"] == "build FAILED: step 1"
    assert fire.event["watch_event"] == "fired" and fire.event["note"] == "check it"
    assert fire.delivery_state == "pending"  # due now: the ledger offers it like a reminder
    # Its one allowed firing said it all: the watch's own row ends with nothing to deliver.
    assert ended.state == "completed" and ended.delivery_state == "dropped"


def test_a_second_firing_waits_out_the_cooldown(server: Server) -> None:
    lines = [f"ready {n}" for n in range(12)]
    proc = server.registry.spawn(_printer(lines, gap=0.25), notify_on_complete=False)
    server.watch(
        "watch_c", process_id=proc["process_id"], pattern="^ready", max_fires=2, cooldown_seconds=1
    )
    wait_for(lambda: len(server.fires("watch_c")) == 2)
    first, second = server.fires("watch_c")
    assert first.event is not None and second.event is not None
    assert first.event["matched"] == "ready 0" and first.event["fires"] == 1
    # The lines between were ignored: the second is the first printed a cooldown later.
    assert second.created_at - first.created_at >= 1.0
    assert second.event["matched"] != "ready 1" and second.event["fires"] == 2
    assert wait_for(lambda: server.ended("watch_c")).delivery_state == "dropped"


def test_a_process_that_exits_unmatched_ends_its_watch_visibly(server: Server) -> None:
    # The last line has no newline and comes right before the exit: it is still read.
    command = f"{sys.executable} -c \"import sys; sys.stdout.write('all good\\nno luck')\""
    proc = server.registry.spawn(command, notify_on_complete=False)
    server.watch("watch_e", process_id=proc["process_id"], pattern="ERROR")
    ended = wait_for(lambda: server.ended("watch_e"))
    assert server.fires("watch_e") == []
    assert ended.delivery_state == "pending" and ended.event is not None
    assert ended.event["watch_event"] == "ended" and ended.event["type"] == SCHEDULED_WAKEUP
    assert server.runtime.queue.get(timeout=WAIT)["delivery_id"] == "watch_e"


def test_the_last_line_before_the_exit_still_fires(server: Server) -> None:
    command = f"{sys.executable} -c \"import sys; sys.stdout.write('x' * 5000 + 'tail\\nDONE ok')\""
    proc = server.registry.spawn(command, notify_on_complete=False)
    server.watch("watch_l", process_id=proc["process_id"], pattern="^DONE")
    wait_for(lambda: server.ended("watch_l"))
    [fire] = server.fires("watch_l")
    assert fire.event is not None and fire.event["matched"] == "DONE ok"


def test_an_interval_command_fires_when_it_starts_exiting_zero(
    server: Server, tmp_path: Path
) -> None:
    flag = tmp_path / "deployed"
    runs = tmp_path / "runs"
    server.watch(
        "watch_i",
        command=f"echo run >> {runs}; test -f {flag} && echo deploy is live",
        interval_seconds=0.1,
    )
    wait_for(lambda: runs.exists() and len(runs.read_text().splitlines()) >= 3)
    assert server.fires("watch_i") == []  # it ran, exited 1, and woke nobody
    flag.touch()
    ended = wait_for(lambda: server.ended("watch_i"))
    [fire] = server.fires("watch_i")
    assert fire.event is not None and "deploy is live" in fire.event["matched"]
    assert ended.delivery_state == "dropped"


def test_a_lifetime_that_runs_out_ends_the_watch_visibly(server: Server) -> None:
    server.watch("watch_x", command="false", interval_seconds=0.1, lifetime_seconds=1)
    ended = wait_for(lambda: server.ended("watch_x"))
    assert ended.state == "completed" and ended.delivery_state == "pending"
    assert ended.event is not None and ended.event["watch_event"] == "expired"
    assert ended.event["fires"] == 0 and ended.event["note"] == "check it"
    assert server.runtime.queue.get(timeout=WAIT)["watch_event"] == "expired"


def test_a_cancelled_watch_never_fires(server: Server, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    server.watch("watch_k", command=f"test -f {flag}", interval_seconds=0.1)
    assert server.watches.running_here() == ["watch_k"]
    outcome = server.runtime.cancel("watch_k", by="test")
    assert outcome.status == "cancelled"
    wait_for(lambda: server.watches.running_here() == [])
    flag.touch()
    time.sleep(0.5)  # several intervals: a watch still running would have fired by now
    assert server.fires("watch_k") == []
    row = server.ledger.get("watch_k")
    assert row is not None and row.state == "cancelled"
    notice = server.runtime.queue.get(timeout=WAIT)
    assert notice["watch_id"] == "watch_k" and notice["status"] == "cancelled"


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_an_adopted_watch_keeps_its_count(tmp_path: Path, dialect: str) -> None:
    """A server died after writing firing 1 of 2; the survivor (another process sharing the
    store) adopts the watch, fires #2 (never #1 again) and ends it."""
    if dialect == "sqlite":
        path = str(tmp_path / "ledger.db")
        store: Callable[[], LedgerStore] = lambda: sqlite_ledger(path)  # noqa: E731
    else:
        url = fresh_url()
        store = lambda: pg_ledger(url)  # noqa: E731
    dead = Server(store(), tmp_path, identity=exited_identity())
    spec = parse_watch(
        {
            "note": "n",
            "command": "true",
            "interval_seconds": 0.1,
            "max_fires": 2,
            "cooldown_seconds": 0,
        },
        time.time(),
        min_interval_seconds=0.1,
    )
    dead.ledger.create(
        "watch_d", kind=WATCH_KIND, state="running", request=spec.as_request(), goal="watch"
    )
    dead.ledger.schedule(
        "watch_d.1", kind=WATCH_FIRE_KIND, event={"type": SCHEDULED_WAKEUP}, not_before=0
    )
    dead.runtime.close()
    survivor = Server(store(), tmp_path)
    try:
        survivor.ledger.recover_abandoned()
        wait_for(lambda: survivor.ended("watch_d"))
        assert [r.id for r in survivor.fires("watch_d")] == ["watch_d.1", "watch_d.2"]
        second = survivor.ledger.get("watch_d.2")
        assert second is not None and second.event is not None and second.event["fires"] == 2
    finally:
        survivor.close()
