"""The servers sharing one store: recorded, pruned when dead, watched by their peers.

Over every backend (the conformance fixture): a server records itself, sees the others,
and forgets the dead. With real processes: a peer that starts work after the survivor's
last look and is then killed has that work recovered at once, not at the next restart.
"""

from __future__ import annotations

import time

from delivery.backend import LedgerBackend
from delivery.identity import ProcessIdentity, current_identity
from delivery.ledger import Ledger
from delivery.reoffer import ReofferScheduler
from tests.delivery._support import FakeClock, identity_of, start_idle_child, stop_child


def _dead_identity() -> str:
    me = current_identity()
    return str(ProcessIdentity(me.host, me.boot_id, me.pid, me.start_ticks + 1))


class _Offers(list):
    def __call__(self, event: dict) -> None:
        self.append((time.time(), event))


def test_a_server_sees_its_live_peers_and_prunes_dead_ones(
    backend: LedgerBackend, clock: FakeClock
) -> None:
    child = start_idle_child()
    try:
        peer = Ledger(backend, clock=clock, identity=str(identity_of(child.pid)))
        ghost = Ledger(backend, clock=clock, identity=_dead_identity())
        assert peer.servers.register("api 127.0.0.1:1") == []
        ghost.servers.register("api 127.0.0.1:2")
        clock.advance(5)
        me = Ledger(backend, clock=clock)

        peers = me.servers.register("api 127.0.0.1:3")

        assert [p.identity for p in peers] == [peer.identity]
        assert peers[0].label == "api 127.0.0.1:1"
        assert f"pid {child.pid}" in peers[0].describe(now=clock())
        assert "up 5 s" in peers[0].describe(now=clock())
        # The dead one's record is gone for everybody; the live ones stay.
        assert {r.identity for r in backend.servers()} == {peer.identity, me.identity}
        assert [p.identity for p in peer.servers.peers()] == [me.identity]

        me.servers.unregister()
        assert [r.identity for r in backend.servers()] == [peer.identity]
    finally:
        stop_child(child)


def test_registering_again_renews_the_record_and_keeps_its_start(
    backend: LedgerBackend, clock: FakeClock
) -> None:
    me = Ledger(backend, clock=clock)
    me.servers.register("first")
    started = backend.servers()[0].started_at
    clock.advance(10)
    me.servers.register("second")
    (record,) = backend.servers()
    assert (record.label, record.started_at, record.heartbeat_at) == (
        "second",
        started,
        started + 10,
    )


def test_a_peer_killed_after_the_survivor_looked_has_its_work_recovered_at_once(
    backend: LedgerBackend,
) -> None:
    """The survivor's last pass saw no rows of the peer: only the server record (and the
    poke its registration sends) lets the survivor watch it before its work exists."""
    survivor = Ledger(backend)
    offers = _Offers()
    sched = ReofferScheduler(survivor, offers, max_sleep_seconds=60, label="survivor")
    sched.start()
    child = start_idle_child()
    try:
        peer = Ledger(backend, identity=str(identity_of(child.pid)))
        peer.servers.register("peer")  # pokes the survivor, which starts watching it
        time.sleep(0.3)
        peer.create("queued-on-peer", kind="delegation", state="queued", session_key="s")
        peer.create("running-on-peer", kind="delegation", state="running", session_key="s")
        time.sleep(0.2)
        assert offers == []  # a live peer's work is its own

        killed_at = time.time()
        child.kill()
        child.wait(timeout=10)
        deadline = time.monotonic() + 5
        while len(offers) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)

        statuses = {e["delegation_id"]: e["status"] for _, e in offers}
        assert statuses == {"queued-on-peer": "interrupted", "running-on-peer": "unknown"}
        assert max(t for t, _ in offers) - killed_at < 1.0
        assert [r.identity for r in survivor.servers.peers()] == []
    finally:
        sched.stop()
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    assert backend.servers() == []  # a stopped scheduler removes its server
