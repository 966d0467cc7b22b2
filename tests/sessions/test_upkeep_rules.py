"""The upkeep side of the session store (``SessionUpkeep``), on every backend: the rules
``delivery.session_rules`` writes once for retention (what each prune forgets, and what it
never touches), a dry run that only counts, and a compaction that names another session's
row refused whole; background units' approvals listed oldest first, and decided approvals
kept a day. ``delivery.retention`` drives the prunes; here they are proved on the store
itself."""

from __future__ import annotations

import time

from delivery.session_backend import ApprovalRecord, SessionBackend
from delivery.session_rules import KEEP_DECIDED_SECONDS
from gateway.config import Platform
from gateway.session import SessionSource, SessionStore
from tests.sessions._support import begin, delivery, make_session, run_sync, state_of, writes

LATER = time.time() + 3600.0  # "before" in the future: every row is old enough
API = SessionSource(platform=Platform.API_SERVER, chat_id="c")
TURN = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def _done(store: SessionStore, sid: str, key: str) -> None:
    run_sync(store.aappend_turn(sid, TURN, idempotency_key=key, response={"id": key}, create=API))


def test_idempotency_prune_forgets_finished_records_never_a_running_claim(
    store: SessionStore, backend: SessionBackend
) -> None:
    assert store.claim_idempotent("running", "owner-1")["claimed"]
    for n in range(3):
        _done(store, f"s{n}", f"done-{n}")
    before = writes(store)
    assert backend.prune_idempotency(LATER, 10, dry_run=True) == 3
    assert writes(store) == before  # a dry run only reads
    assert backend.prune_idempotency(time.time() - 3600.0, 10) == 0  # none is that old
    assert backend.prune_idempotency(LATER, 2) == 2  # at most ``limit``
    assert backend.prune_idempotency(LATER, 10) == 1
    assert backend.prune_idempotency(LATER, 10, dry_run=True) == 0
    # The finished ones are forgotten: the key may run again ...
    assert store.claim_idempotent("done-0", "owner-2")["claimed"]
    # ... while the running claim is still its owner's.
    held = store.claim_idempotent("running", "owner-2")
    assert not held["claimed"] and held["owner"] == "owner-1" and held["state"] == "running"


def test_tombstone_prune_forgets_deleted_ids(store: SessionStore, backend: SessionBackend) -> None:
    for sid in ("gone_1", "gone_2"):
        make_session(store, sid)
        store.delete_session(sid)
    make_session(store, "kept")
    assert state_of(store, "gone_1") == "deleted"
    assert backend.prune_tombstones(LATER, 10, dry_run=True) == 2
    assert state_of(store, "gone_1") == "deleted"
    assert backend.prune_tombstones(LATER, 1) == 1
    assert backend.prune_tombstones(LATER, 10) == 1
    assert {state_of(store, "gone_1"), state_of(store, "gone_2")} == {"unknown"}
    assert state_of(store, "kept") == "live"


def _compacted(store: SessionStore) -> tuple[list[int], int]:
    """A session ``s`` whose first two rows a compaction archived: (their ids, summary id)."""
    make_session(store, "s")
    old = [store.append_message("s", "user", "hello").id]
    old.append(store.append_message("s", "assistant", "hi").id)
    store.append_message("s", "user", "newest")
    store.take_turn("s", "st_1")
    summary = run_sync(
        store.acompact("s", "st_1", old, {"role": "system", "content": "[reveille:summary] s"})
    )
    assert summary is not None
    return old, summary.id


def test_archived_prune_deletes_only_archived_rows(
    store: SessionStore, backend: SessionBackend
) -> None:
    old, summary_id = _compacted(store)
    assert backend.prune_archived_messages(time.time() - 3600.0, 10) == 0
    assert backend.prune_archived_messages(LATER, 10, dry_run=True) == 2
    assert [m.id for m in store.messages("s")][:2] == old  # a dry run deletes nothing
    assert backend.prune_archived_messages(LATER, 1) == 1
    assert backend.prune_archived_messages(LATER, 10) == 1
    left = store.messages("s")
    assert not any(m.archived for m in left)
    assert summary_id in {m.id for m in left}  # the live summary is never archived
    assert [m.content for m in left if m.role == "user"] == ["newest"]
    # What a turn reads is unchanged by the prune: the summary and the newest row.
    assert [m.id for m in begin(store, "s").history] == [m.id for m in left]


def test_a_compaction_naming_another_sessions_row_is_refused_whole(store: SessionStore) -> None:
    make_session(store, "s")
    make_session(store, "other")
    mine = store.append_message("s", "user", "mine").id
    theirs = store.append_message("other", "user", "theirs").id
    store.take_turn("s", "st_1")
    before = writes(store)
    summary = {"role": "system", "content": "[reveille:summary] s"}
    assert run_sync(store.acompact("s", "st_1", [mine, theirs], summary)) is None
    assert writes(store) - before <= 1  # at most the refused transaction itself
    assert not any(m.archived for m in store.messages("s"))
    assert [m.id for m in store.messages("s")] == [mine]  # no summary row either
    assert not any(m.archived for m in store.messages("other"))


def test_unfolded_deliveries_are_those_no_turn_folded(
    store: SessionStore, backend: SessionBackend
) -> None:
    make_session(store, "s")
    delivery(store, "s", 1)
    delivery(store, "s", 2)
    wanted = [("s", "deleg:1"), ("s", "deleg:2"), ("s", "deleg:3"), ("nobody", "deleg:1")]
    assert backend.unfolded_deliveries(wanted) == {("s", "deleg:1"), ("s", "deleg:2")}
    assert len(begin(store, "s").taken) == 2
    assert backend.unfolded_deliveries(wanted) == set()
    assert backend.unfolded_deliveries([]) == set()


def _approval(aid: str, *, created_at: float, unit: bool) -> ApprovalRecord:
    return ApprovalRecord(
        aid,
        "s",
        "" if unit else "st_1",
        f"echo {aid}",
        "pending",
        created_at,
        unit_id=f"deleg_{aid}" if unit else "",
        owner="someone" if unit else "",
        expires_at=created_at + 60.0 if unit else 0.0,
    )


def test_unit_approvals_are_listed_oldest_first_and_decided_ones_kept_a_day(
    store: SessionStore,
) -> None:
    now = time.time()
    make_session(store, "s")
    store.take_turn("s", "st_1")
    assert store.ask_approval(_approval("u_new", created_at=now, unit=True))
    assert store.ask_approval(_approval("u_old", created_at=now - 5.0, unit=True))
    assert store.ask_approval(_approval("turn", created_at=now, unit=False))  # a turn's
    assert [a.id for a in store.pending_unit_approvals()] == ["u_old", "u_new"]
    assert store.decide_approval("u_old", True)[1]
    assert [a.id for a in store.pending_unit_approvals()] == ["u_new"]
    # A day later, the next approval asked forgets what was decided before then (and
    # nothing pending); until then a decided one stays, told apart from an unknown id.
    assert store.get_approval("u_old") is not None
    assert store.ask_approval(
        _approval("u_later", created_at=now + KEEP_DECIDED_SECONDS, unit=True)
    )
    assert store.get_approval("u_old") is None
    assert store.get_approval("u_new") is not None and store.get_approval("turn") is not None
