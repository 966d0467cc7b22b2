"""Background commands outlive their server: the wrapper's files and the adoption of a dead
owner's process rows, with real processes and a real SQLite ledger.

A "dead server" is a runtime whose ledger identity is a real process that has exited; its
registry starts the command but never follows it (as if it was killed right after the
spawn). A second runtime, with this process's identity, recovers and adopts.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delivery.ledger import Ledger
from gateway.wake_text import format_wake_text
from tests.delivery._support import exited_identity, identity_of, start_idle_child, stop_child
from tests.stores import sqlite_ledger
from tools.background_processes import (
    EXIT_FILE,
    NOT_FOUND_ERROR,
    OUTPUT_FILE,
    VANISHED_ERROR,
    WRAPPER_FILE,
    ProcessRegistry,
    read_exit_status,
    read_wrapper_identity,
)
from tools.completion_queue import CompletionQueue
from tools.delegation_runtime import DelegationRuntime

WAIT = 10.0


class Server:
    """One server's runtime and registry over the shared ledger file."""

    def __init__(self, path: Path, identity: str | None = None, *, follow: bool = True) -> None:
        self.runtime = DelegationRuntime(
            Ledger(sqlite_ledger(str(path)), identity=identity), CompletionQueue()
        )
        self.registry = ProcessRegistry(CompletionQueue(), runtime=lambda: self.runtime)
        if not follow:
            # Killed right after the spawn: nothing of this server follows the command.
            self.registry._watch = lambda *args: None  # type: ignore[method-assign]
        # Servers sharing a state directory share its process files (where adoption looks).
        self.registry.attach(self.runtime.ledger, directory=path.parent / "processes")

    @property
    def ledger(self) -> Ledger:
        return self.runtime.ledger

    def events(self, timeout: float = WAIT) -> dict[str, Any]:
        return self.registry.completion_queue.get(timeout=timeout)

    def close(self) -> None:
        self.runtime.close()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def servers(path: Path) -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for server in made:
        for info in server.registry.list_running():
            if info["pid"]:
                with contextlib.suppress(OSError):
                    os.killpg(info["pid"], signal.SIGKILL)
        server.close()


def dead_server(path: Path, servers: list[Server]) -> Server:
    server = Server(path, exited_identity(), follow=False)
    servers.append(server)
    return server


def live_server(path: Path, servers: list[Server]) -> Server:
    server = Server(path)
    servers.append(server)
    return server


def wait_for(check: Any, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_the_files_are_private_and_go_once_the_result_is_in_the_ledger(
    path: Path, servers: list[Server]
) -> None:
    server = live_server(path, servers)
    info = server.registry.spawn("echo started; sleep 0.5; echo done; exit 7")
    directory = path.parent / "processes" / info["process_id"]
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(directory.parent.stat().st_mode) == 0o700
    for name in (OUTPUT_FILE, WRAPPER_FILE):
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600
    ident = read_wrapper_identity(directory)
    assert ident is not None and ident.pid == info["pid"] and not ident.is_known_dead()
    wait_for(lambda: (directory / OUTPUT_FILE).read_bytes() == b"started\n")
    assert server.registry.poll(info["process_id"])["output_tail"] == "started\n"  # type: ignore[index]
    evt = server.events()
    assert (evt["exit_code"], evt["output_tail"], evt["status"]) == (7, "started\ndone\n", "failed")
    assert "adopted" not in evt
    wait_for(lambda: not directory.exists())
    row = server.ledger.get(info["process_id"])
    assert row is not None and row.event["output_tail"] == "started\ndone\n"


def test_the_registry_keeps_files_where_it_is_told_not_where_the_ledger_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A ledger in PostgreSQL lives on no local path: the composition root hands the
    # registry its directory; an embedder that wires nothing gets REVEILLE_HOME's.
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path / "home"))
    registry = ProcessRegistry(CompletionQueue())
    assert registry.processes_dir == tmp_path / "home" / "processes"
    runtime = DelegationRuntime(
        Ledger(sqlite_ledger(tmp_path / "l" / "ledger.db")), CompletionQueue()
    )
    try:
        registry.attach(runtime.ledger, directory=tmp_path / "state" / "processes")
        assert registry.processes_dir == tmp_path / "state" / "processes"
    finally:
        runtime.close()


def test_the_command_gets_default_signal_dispositions(path: Path, servers: list[Server]) -> None:
    server = live_server(path, servers)
    # As a server started with ``&`` by a script (SIGQUIT) or under nohup (SIGHUP) has them.
    inherited = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGQUIT, signal.SIGHUP)}
    try:
        server.registry.spawn("grep -E '^Sig(Ign|Blk)' /proc/self/status")
    finally:
        for s, handler in inherited.items():
            signal.signal(s, handler)
    evt = server.events()
    masks = dict(line.split(":\t") for line in evt["output_tail"].splitlines())
    # none of the standard signals blocked or ignored (SIGPIPE included, unlike the wrapper)
    assert masks.keys() == {"SigBlk", "SigIgn"}
    assert all(int(mask, 16) & 0x7FFFFFFF == 0 for mask in masks.values()), masks


def test_the_wrapper_records_the_exit_status_atomically_and_survives_a_group_term(
    path: Path, servers: list[Server]
) -> None:
    dead = dead_server(path, servers)
    info = dead.registry.spawn("echo up; sleep 30")
    directory = path.parent / "processes" / info["process_id"]
    wait_for(lambda: (directory / OUTPUT_FILE).read_bytes() == b"up\n")
    os.killpg(info["pid"], signal.SIGTERM)  # the whole group, wrapper included
    recorded = wait_for(lambda: read_exit_status(directory))
    assert recorded[0] == -signal.SIGTERM
    assert (directory / EXIT_FILE).read_text() == f"{-signal.SIGTERM}\n"
    assert stat.S_IMODE((directory / EXIT_FILE).stat().st_mode) == 0o600
    assert not (directory / "exit.tmp").exists()
    os.waitpid(info["pid"], 0)  # the dead server's child: reap it here


def test_a_command_that_ended_while_its_server_was_dead_reports_its_real_outcome(
    path: Path, servers: list[Server]
) -> None:
    dead = dead_server(path, servers)
    info = dead.registry.spawn("echo done; exit 7", session_key="s1")
    directory = path.parent / "processes" / info["process_id"]
    wait_for(lambda: read_exit_status(directory))
    os.waitpid(info["pid"], 0)
    survivor = live_server(path, servers)
    assert survivor.ledger.recover_abandoned() == []  # adopted, not settled as unknown
    evt = survivor.events()
    assert evt["delivery_id"] == info["process_id"] and evt["session_key"] == "s1"
    assert (evt["exit_code"], evt["output_tail"], evt["status"]) == (7, "done\n", "failed")
    assert evt["adopted"] is True and "error" not in evt
    row = survivor.ledger.get(info["process_id"])
    assert row is not None and row.state == "failed" and row.owner == survivor.ledger.identity
    assert [h["action"] for h in survivor.ledger.history(info["process_id"])] == ["adopt"]
    # once only, whatever recovers next
    assert survivor.ledger.recover_abandoned() == []
    with pytest.raises(queue.Empty):
        survivor.events(timeout=0.2)
    wait_for(lambda: not directory.exists())


def test_a_command_still_running_is_waited_for_then_reported(
    path: Path, servers: list[Server]
) -> None:
    dead = dead_server(path, servers)
    info = dead.registry.spawn("sleep 0.6; echo late; exit 3")
    survivor = live_server(path, servers)
    started = time.monotonic()
    survivor.ledger.recover_abandoned()
    running = survivor.registry.list_running()
    assert [r["process_id"] for r in running] == [info["process_id"]]
    assert running[0]["pid"] == info["pid"]
    assert survivor.registry.poll(info["process_id"])["status"] == "running"  # type: ignore[index]
    # It is the dead server's child here, so reap it as init would (the pidfd still fires).
    threading.Thread(target=os.waitpid, args=(info["pid"], 0), daemon=True).start()
    evt = survivor.events()
    assert time.monotonic() - started >= 0.4
    assert (evt["exit_code"], evt["output_tail"], evt["status"]) == (3, "late\n", "failed")
    assert evt["adopted"] is True and evt["duration_seconds"] >= 0.5
    assert survivor.registry.list_running() == []


def test_an_adopted_command_can_be_killed(path: Path, servers: list[Server]) -> None:
    dead = dead_server(path, servers)
    info = dead.registry.spawn("echo up; sleep 30")
    directory = path.parent / "processes" / info["process_id"]
    survivor = live_server(path, servers)
    survivor.ledger.recover_abandoned()
    wait_for(lambda: (directory / OUTPUT_FILE).read_bytes() == b"up\n")
    threading.Thread(target=os.waitpid, args=(info["pid"], 0), daemon=True).start()
    assert survivor.registry.kill(info["process_id"]) is True
    evt = survivor.events()
    assert evt["status"] == "cancelled" and evt["exit_code"] == -signal.SIGTERM


def test_a_wrapper_killed_before_it_recorded_anything_is_reported_unknown_in_words(
    path: Path, servers: list[Server]
) -> None:
    dead = dead_server(path, servers)
    info = dead.registry.spawn("echo up; sleep 30")
    directory = path.parent / "processes" / info["process_id"]
    survivor = live_server(path, servers)
    survivor.ledger.recover_abandoned()
    wait_for(lambda: (directory / OUTPUT_FILE).read_bytes() == b"up\n")
    os.kill(info["pid"], signal.SIGKILL)  # the wrapper only; its command lives on
    os.waitpid(info["pid"], 0)
    evt = survivor.events()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(info["pid"], signal.SIGKILL)
    assert evt["status"] == "unknown" and evt["exit_code"] is None
    assert evt["error"] == VANISHED_ERROR and evt["abandoned"] is True


def test_a_command_that_cannot_be_found_is_reported_unknown_in_words(
    path: Path, servers: list[Server]
) -> None:
    dead = dead_server(path, servers)
    dead.ledger.create(
        "proc_gone",
        kind="process",
        state="running",
        goal="make -j8",
        request={"type": "completion", "process_id": "proc_gone", "command": "make -j8"},
    )
    survivor = live_server(path, servers)
    survivor.ledger.recover_abandoned()
    evt = survivor.events()
    assert evt["status"] == "unknown" and evt["exit_code"] is None
    assert evt["error"] == NOT_FOUND_ERROR and evt["abandoned"] is True
    assert "could not be found after the restart" in NOT_FOUND_ERROR
    assert "its exit status was never recorded" in NOT_FOUND_ERROR
    text = format_wake_text(evt)
    assert "can no longer be followed" in text and "has exited" not in text
    assert NOT_FOUND_ERROR in text and "make -j8" in text
    row = survivor.ledger.get("proc_gone")
    assert row is not None and row.state == "unknown"


def test_without_an_adopter_a_dead_owners_process_is_settled_as_before(
    path: Path, servers: list[Server]
) -> None:
    dead = dead_server(path, servers)
    dead.ledger.create("proc_old", kind="process", state="running", request={"command": "x"})
    survivor = live_server(path, servers)
    survivor.ledger.set_adopter("process", None)
    (event,) = survivor.ledger.recover_abandoned()
    assert event["status"] == "unknown" and event["abandoned"] is True


def test_two_survivors_adopt_a_process_once(path: Path, servers: list[Server]) -> None:
    dead = dead_server(path, servers)
    info = dead.registry.spawn("echo once")
    directory = path.parent / "processes" / info["process_id"]
    wait_for(lambda: read_exit_status(directory))
    os.waitpid(info["pid"], 0)
    survivors = [live_server(path, servers) for _ in range(2)]
    # Two servers in one test process share an identity: make the second one distinct.
    survivors[1].ledger.identity = survivors[1].ledger.identity + "-peer"
    barrier = threading.Barrier(2)

    def recover(server: Server) -> None:
        barrier.wait()
        server.ledger.recover_abandoned()

    threads = [threading.Thread(target=recover, args=(s,)) for s in survivors]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(0.3)
    got = [q for s in survivors for q in s.registry.completion_queue.drain()]
    assert [e["output_tail"] for e in got] == ["once\n"]


def test_a_survivor_adopts_at_once_when_its_peer_dies(path: Path, servers: list[Server]) -> None:
    """No restart: the survivor's re-offer scheduler sees the peer exit (pidfd) and adopts."""
    peer_proc = start_idle_child()
    try:
        peer = Server(path, str(identity_of(peer_proc.pid)), follow=False)
        servers.append(peer)
        info = peer.registry.spawn("sleep 0.5; echo after; exit 5")
        survivor = live_server(path, servers)
        survivor.runtime.start_scheduler()
        time.sleep(0.2)  # the scheduler is watching the peer, which still lives
        assert survivor.registry.list_running() == []
    finally:
        stop_child(peer_proc)  # the peer server dies
    threading.Thread(target=os.waitpid, args=(info["pid"], 0), daemon=True).start()
    evt = survivor.events()
    assert (evt["exit_code"], evt["output_tail"], evt["adopted"]) == (5, "after\n", True)
    row = survivor.ledger.get(info["process_id"])
    assert row is not None and row.owner == survivor.ledger.identity
