"""Compaction over a long conversation (issue 21 item 2): 200 turns with a small context
window that compacts several times while background results arrive, against a fake
OpenAI-compatible model on loopback that counts what each call saw, over SQLite and
PostgreSQL; then a compaction killed (SIGKILL) mid-way, and the conversation continued.

What is proved, from what the model was sent and what the store holds:

* no result lost: every result reached a model call of a stored turn verbatim, and the
  last context still carries each one, verbatim or named (its delivery id) in the summary;
* none seen twice: no context holds a result twice, and once a result left the contexts
  (summarised) it never comes back;
* none summarised before a stored turn's model call saw it (checked at each summarisation
  call, and in the store: no archived delivery row is unseen);
* the summary stays bounded, archived rows stay readable, a crash leaves nothing half-done.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.markers import SUMMARY_MARKER
from gateway.session import SessionStore
from tests.agent.test_openai_compat import FakeOpenAI
from tests.gateway import compaction_support as cs
from tests.pg_support import fresh_url
from tests.sessions._support import append_turn
from tests.stores import pg_sessions, sqlite_sessions

CHILD = Path(__file__).with_name("compaction_child.py")


@pytest.fixture
async def model() -> AsyncIterator[tuple[FakeOpenAI, cs.CountingModel]]:
    server = FakeOpenAI()
    counting = cs.CountingModel()
    server.default = counting
    await server.start()
    yield server, counting
    await server.stop()


def store_at(kind: str, tmp_path: Path) -> tuple[SessionStore, str]:
    if kind == "sqlite":
        where = str(tmp_path / "sessions.db")
        return SessionStore(sqlite_sessions(where)), where
    url = fresh_url()
    return SessionStore(pg_sessions(url)), url


def check(store: SessionStore, counting: cs.CountingModel, *, crashed: bool = False) -> None:
    assert not counting.violations
    rows = store.messages(cs.SESSION)
    results = {
        f"RESULT-{int(str(r.display_metadata['delegation_id'])[len('deleg_') :])}": r
        for r in rows
        if r.is_delivery
    }
    assert results
    normal = [c for c in counting.calls if not c.summarise]
    for token, row in results.items():
        showing = [i for i, c in enumerate(normal) if token in c.tokens]
        assert showing, f"{token} never reached the model"
        assert any(normal[i].ok for i in showing), f"{token} never reached an answered call"
        # Folded once: from its fold until its summary, then never again.
        assert showing == list(range(showing[0], showing[-1] + 1)), token
        assert not row.archived or row.seen, f"{token} archived before a stored turn saw it"
    for call in counting.calls:
        assert len(call.tokens) == len(set(call.tokens)), "a result shown twice in one call"
    # The last context names every result: verbatim, or by its id in the summary.
    last = normal[-1]
    summaries = [r for r in rows if r.display_metadata and "summary" in r.display_metadata]
    live = [r for r in summaries if not r.archived]
    assert len(live) == 1
    summary = live[0]
    assert summary.content.startswith(SUMMARY_MARKER)
    named = {d["id"] for d in summary.display_metadata["summary"]["deliveries"]}
    for token, row in results.items():
        assert not (row.archived and token in last.tokens), f"{token} summarised, yet sent"
        if token not in last.tokens:
            assert row.archived and row.display_metadata["delegation_id"] in named, token
            assert row.display_metadata["delegation_id"] in summary.content
    # Bounded: each summary's prose within the cap, whatever the number of compactions.
    for s in summaries:
        assert len(s.display_metadata["summary"]["body"]) <= cs.POLICY.summary_chars
    # Archived, never deleted: every stored user message is still in the transcript.
    users = [r for r in rows if r.role == "user"]
    assert any(r.archived for r in users)
    assert all(r.summary_id is not None for r in rows if r.archived)
    if not crashed:
        answered = [r for r in users if not (r.display_metadata or {}).get("failed")]
        assert len(answered) == sum(1 for c in normal if c.ok)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_200_turns_compact_without_losing_or_repeating_a_result(
    kind: str, tmp_path: Path, model: tuple[FakeOpenAI, cs.CountingModel]
) -> None:
    server, counting = model
    store, _ = store_at(kind, tmp_path)
    cs.open_session(store)
    service = cs.service_for(store, server.base_url)
    assert service.compactor is not None

    def after(n: int, ok: bool) -> None:
        if ok:
            counting.turn_stored()
        else:
            # What the web UI keeps of a failed turn: the message, marked failed.
            meta = {"failed": True, "error": "boom"}
            append_turn(
                store,
                cs.SESSION,
                [{"role": "user", "content": f"failed {n}", "display_metadata": meta}],
            )
        if n == 64:
            # Turns 65-70 fold results 65 and 70, then fail: both stay pinned, pushed back
            # by the failed messages, when turn 71 is refused "context length exceeded"
            # and compacts all but its newest rows before its one retry.
            counting.fail_next = 6
        if n == 70:
            counting.refuse_next = 1
        if n == 119:
            counting.refuse_next = 1  # turn 120 folds result 120: pinned while it retries

    await cs.drive(store, service, range(1, 201), after)
    assert service.compactor.compactions >= 5
    refused = [c for c in counting.calls if not c.summarise and not c.ok]
    assert len(refused) == 8
    check(store, counting)
    store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_compaction_killed_midway_leaves_nothing_half_done(
    kind: str, tmp_path: Path, model: tuple[FakeOpenAI, cs.CountingModel]
) -> None:
    server, counting = model
    store, where = store_at(kind, tmp_path)
    cs.open_session(store)
    counting.hang_summaries = True
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        where,
        server.base_url,
        "1",
        "200",
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert child.stdout is not None
    done: list[int] = []

    async def read() -> None:
        assert child.stdout is not None
        async for line in child.stdout:
            parts = line.decode().split()
            done.append(int(parts[1]))
            if parts[2] == "True":
                counting.turn_stored()

    reader = asyncio.create_task(read())
    await asyncio.wait_for(counting.summary_started.wait(), 60)
    before = store.messages(cs.SESSION)
    child.send_signal(signal.SIGKILL)
    await child.wait()
    await reader
    counting.release.set()  # the hung call answers a client that is gone
    # Killed in the middle of its summarisation call: nothing of the compaction is there.
    after_kill = store.messages(cs.SESSION)
    assert [r.id for r in after_kill] == [r.id for r in before]
    assert not any(r.archived for r in after_kill)
    assert not any(r.display_metadata and "summary" in r.display_metadata for r in after_kill)
    # Restarted: the conversation goes on and compacts (the dead holder's lease is broken).
    counting.hang_summaries = False
    service = cs.service_for(store, server.base_url)

    def after(n: int, ok: bool) -> None:
        if ok:
            counting.turn_stored()

    first = max(done) + 1
    await cs.drive(store, service, range(first, first + 80), after)
    assert service.compactor is not None and service.compactor.compactions >= 2
    check(store, counting, crashed=True)
    store.close()
