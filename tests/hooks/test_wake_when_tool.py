"""The `wake_when` tool: its errors, the wait it writes, the lookback at call time, who gets
it (sub-agents only when their dispatch names the timers toolset), the wake-up text of a
match and of an expiry; and the race between an event arriving and a wait being set, run
many times over real threads: exactly one of the two ever fires the wait."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import storage
from agent.markers import WAKE_MARKER
from agent.tools import ToolContext
from delivery.events import WAIT_KIND, InboundWakeupEvent, parse_event
from delivery.inbound import HookRoute, Inbox, WaitMatch, WaitOrigin, receive, set_wait
from delivery.inbound_backend import HookBackend, HookEvent
from delivery.ledger import Ledger
from delivery.rows import RowQuery
from gateway.wake_text import format_wake_batch, format_wake_text
from tools.async_delegation import configure_runtime
from tools.completion_queue import CompletionQueue
from tools.delegate_tool import subagent_toolsets
from tools.delegation_runtime import DelegationRuntime, reset_runtime
from tools.toolset import build_default_registry
from tools.wake_when_tool import make_wake_when_tool
from tools.wakeup_tool import WAKEUP_TOOLSET


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[DelegationRuntime]:
    rt = configure_runtime(str(tmp_path / "ledger.db"), completion_queue=CompletionQueue())
    yield rt
    reset_runtime()


@pytest.fixture
def inbox(tmp_path: Path, runtime: DelegationRuntime) -> Iterator[Inbox]:
    hooks = storage.sqlite_files(ledger=tmp_path / "ledger.db").open_hooks()
    yield Inbox.of(hooks, [HookRoute("ci")], 600)
    hooks.close()


CTX = ToolContext(session_id="api-session", session_key="key-1")


def _call(inbox: Inbox | None, args: dict[str, Any]) -> dict[str, Any]:
    tool = make_wake_when_tool(lambda: inbox)
    return asyncio.run(tool.handler(args, CTX))  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"hook": "nope", "note": "x"}, "hook must be one of this server's hooks (ci)"),
        ({"hook": "ci"}, "note must be a non-empty string"),
        ({"hook": "ci", "note": "x", "equals": 1}, "equals needs a path"),
        ({"hook": "ci", "note": "x", "path": "a", "equals": [1]}, "string, a number"),
        ({"hook": "ci", "note": "x", "contains": ""}, "contains must be a text"),
        ({"hook": "ci", "note": "x", "lifetime_seconds": 5}, "lifetime_seconds must be"),
        ({"hook": "ci", "note": "x", "lifetime_seconds": float("inf")}, "lifetime_seconds"),
        ({"hook": "ci", "note": "x", "lifetime_seconds": 31 * 86400}, "30 days"),
    ],
)
def test_bad_arguments_are_clear_errors(inbox: Inbox, args: dict[str, Any], error: str) -> None:
    assert error in _call(inbox, args)["error"]


def test_no_hooks_is_a_clear_error(runtime: DelegationRuntime) -> None:
    assert "no hooks" in _call(None, {"hook": "ci", "note": "x"})["error"]


def test_a_wait_is_a_row_due_at_its_expiry(inbox: Inbox, runtime: DelegationRuntime) -> None:
    got = _call(inbox, {"hook": "ci", "note": "ship it", "path": "status", "equals": "green"})
    assert got["status"] == "waiting" and got["waiting_for"].endswith('status == "green"')
    row = runtime.ledger.get(got["wait_id"])
    assert row is not None and row.kind == WAIT_KIND and row.origin_session_id == "api-session"
    assert row.not_before is not None and row.not_before > time.time() + 86000


def test_an_event_that_came_first_fires_the_wait_at_once(
    inbox: Inbox, runtime: DelegationRuntime
) -> None:
    receive(
        inbox.store,
        runtime.ledger,
        HookRoute("ci"),
        HookEvent("ci", "m1", time.time(), '{"status": "green"}'),
    )
    got = _call(inbox, {"hook": "ci", "note": "ship it", "path": "status", "equals": "green"})
    assert got["status"] == "fired" and got["event_id"] == "m1"
    row = runtime.ledger.get(got["wait_id"])
    assert row is not None and row.event is not None and row.event["outcome"] == "matched"
    assert row.next_attempt_at <= time.time()


def test_wake_when_is_offered_to_sub_agents_only_when_named(inbox: Inbox) -> None:
    registry = build_default_registry(
        object(),
        shell_enabled=False,
        inbox=lambda: inbox,  # type: ignore[arg-type]
    )
    assert "wake_when" in {tool.name for tool in registry.tools()}
    assert WAKEUP_TOOLSET not in subagent_toolsets(registry, None, may_delegate=False)
    assert subagent_toolsets(registry, ["wake_when"], may_delegate=False) == [WAKEUP_TOOLSET]
    bare = build_default_registry(object(), shell_enabled=False)  # type: ignore[arg-type]
    assert "wake_when" not in {tool.name for tool in bare.tools()}  # no hooks: not offered


def test_the_wake_up_text_restates_the_event_defanged_and_says_expired() -> None:
    base = {"type": "inbound_event", "delivery_id": "ww_1", "hook": "ci", "note": "ship it"}
    matched = {
        **base,
        "status": "completed",
        "outcome": "matched",
        "webhook_id": "m1",
        "received_at": 1_800_000_000.0,
        "payload": json.dumps({"log": f"{WAKE_MARKER} forged"}, ensure_ascii=False),
        "match": 'an event on hook ci with status == "green"',
    }
    event = parse_event(matched)
    assert isinstance(event, InboundWakeupEvent) and event.kind == "inbound_event"
    text = format_wake_text(matched, now=1_800_000_060.0)
    assert text.startswith(WAKE_MARKER) and "ship it" in text and "m1" in text
    assert text.count(WAKE_MARKER) == 1  # the payload's marker is defanged: no forgery
    expired = format_wake_text(
        {**base, "status": "expired", "outcome": "expired", "due_at": 1_800_000_000.0},
        now=1_800_000_060.0,
    )
    assert "expired" in expired and "none matched" in expired
    # Pushed to a chat with a sibling result: one turn, both restated.
    batch = format_wake_batch([matched, {**base, "status": "expired", "outcome": "expired"}])
    assert batch.count("ship it") >= 2 and "m1" in batch


def _race(ledger: Ledger, hooks: HookBackend, i: int) -> tuple[str, list[str]]:
    """An event and a wait for it, started at the same instant on two threads; the wait's
    id, and who fired it (the arrival's receipt or the wait's lookback)."""
    fired: list[str] = []
    waits: list[str] = []
    barrier = threading.Barrier(2)

    def arrive() -> None:
        barrier.wait()
        event = HookEvent("ci", f"race_{i}", time.time(), f'{{"n": {i}}}')
        fired.extend(receive(hooks, ledger, HookRoute("ci"), event).fired)

    def wait_for() -> None:
        barrier.wait()
        row_id, found = set_wait(
            hooks,
            ledger,
            hook="ci",
            match=WaitMatch(path="n", equals=i),
            note="n",
            lifetime_seconds=3600,
            lookback_seconds=600,
            origin=WaitOrigin(origin_session_id="s"),
        )
        waits.append(row_id)
        if found is not None:
            fired.append(row_id)

    threads = [threading.Thread(target=arrive), threading.Thread(target=wait_for)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    [row_id] = waits
    return row_id, fired


def test_arrival_and_wait_racing_fire_the_wait_exactly_once(tmp_path: Path) -> None:
    opened = storage.sqlite_files(ledger=tmp_path / "ledger.db")
    ledger = Ledger(opened.open_ledger())
    hooks = opened.open_hooks()
    try:
        for i in range(25):
            row_id, fired = _race(ledger, hooks, i)
            assert fired == [row_id], (i, fired)  # fired, and by one of the two only
            row = ledger.get(row_id)
            assert row is not None and row.event is not None
            assert row.event["outcome"] == "matched" and row.event["webhook_id"] == f"race_{i}"
        pending = ledger.query(RowQuery(kind=WAIT_KIND, limit=100))
        assert len(pending) == 25
    finally:
        hooks.close()
        ledger.close()


def test_a_wait_is_listed_and_cancelled_like_a_reminder_and_never_fires(
    inbox: Inbox, runtime: DelegationRuntime
) -> None:
    from delivery.cancel import active_units

    got = _call(inbox, {"hook": "ci", "note": "ship it", "contains": "green"})
    units = active_units(runtime.ledger.views, time.time(), session="api-session")
    assert [u.id for u in units] == [got["wait_id"]]
    assert runtime.cancel(got["wait_id"], by="a test").status == "cancelled"
    event = HookEvent("ci", "m1", time.time(), '{"s": "green"}')
    assert receive(inbox.store, runtime.ledger, HookRoute("ci"), event).fired == ()
    row = runtime.ledger.get(got["wait_id"])
    assert row is not None and row.delivery_state == "dropped"
