"""delivery.events: parse_event over every kind and legacy spelling, the round trip to the
wire dict, delivery_id, display_metadata, and malformed input (never a crash)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from delivery.backend import COLUMNS
from delivery.event_display import display_metadata
from delivery.events import (
    ASYNC_DELEGATION,
    PROCESS_COMPLETION,
    AbandonedWork,
    DelegationBatchEvent,
    DelegationEvent,
    GenericEvent,
    MalformedEvent,
    ProcessCompletionEvent,
    delegation_counts,
    delivery_id,
    parse_event,
)
from delivery.recovery import abandoned_event, mark_reoffered
from delivery.rows import LedgerRow

SINGLE = {
    "type": "async_delegation",
    "delegation_id": "deleg_00ff",
    "session_key": "agent:main:api_server:dm:s1",
    "origin_session_id": "s1",
    "origin_ui_session_id": None,
    "parent_session_id": None,
    "goal": "count the stars",
    "context": "for the club",
    "toolsets": ["terminal"],
    "role": None,
    "model": "reveille-demo",
    "status": "completed",
    "summary": "About 10^24.",
    "duration_seconds": 1.5,
    "dispatched_at": 1_700_000_000.0,
    "completed_at": 1_700_000_001.5,
}
BATCH = {
    "type": "async_delegation",
    "delegation_id": "deleg_ba7c",
    "is_batch": True,
    "goals": ["first", "second", "third"],
    "status": "failed",
    "results": [
        {"goal": "first", "status": "completed", "summary": "one"},
        {"status": "failed", "error": "two broke"},
        "not even a dict",
    ],
    "total_duration_seconds": 9,
}
PROCESS = {
    "type": "completion",
    "delivery_id": "proc_1234",
    "process_id": "proc_1234",
    "command": "make test",
    "cwd": "/srv",
    "status": "failed",
    "exit_code": 2,
    "output_tail": "a\nb\nerror: c",
    "output_bytes": 12,
    "duration_seconds": 3.5,
}


def test_the_type_literals() -> None:
    assert (ASYNC_DELEGATION, PROCESS_COMPLETION) == ("async_delegation", "completion")


def test_single_delegation() -> None:
    evt = parse_event(SINGLE)
    assert isinstance(evt, DelegationEvent) and evt.kind == "delegation"
    assert evt.delegation_id == "deleg_00ff" and evt.goal == "count the stars"
    assert evt.toolsets == ("terminal",) and evt.succeeded and not evt.restored
    assert evt.origin_session_id == "s1" and evt.duration_seconds == 1.5


def test_batch_with_per_item_results() -> None:
    evt = parse_event(BATCH)
    assert isinstance(evt, DelegationBatchEvent) and evt.kind == "delegation_batch"
    assert evt.goals == ("first", "second", "third")
    assert [r.status for r in evt.results] == ["completed", "failed", None]
    assert evt.goal_of(1) == "second" and evt.results[2].raw == "not even a dict"
    assert evt.total_duration_seconds == 9
    assert (
        delegation_counts(evt)
        == delegation_counts(BATCH)
        == {
            "tasks": 3,
            "completed": 1,
            "failed": 2,
        }
    )
    # results without is_batch still make a batch (as the old readers did)
    assert parse_event({"type": "async_delegation", "results": []}).kind == "delegation_batch"


def test_process_completion_and_every_legacy_spelling() -> None:
    evt = parse_event(PROCESS)
    assert isinstance(evt, ProcessCompletionEvent) and evt.kind == "process"
    assert (evt.exit_code, evt.output_tail, evt.command) == (2, "a\nb\nerror: c", "make test")
    for key in ("exit_code", "returncode", "return_code"):
        assert parse_event({"type": "completion", key: 7}).exit_code == 7
    for key in ("output_tail", "output", "tail", "stdout"):
        assert parse_event({"type": "completion", key: "out"}).output_tail == "out"
    for key in ("command", "cmd"):
        assert parse_event({"type": "completion", key: "ls"}).command == "ls"
    for key in ("process_id", "proc_id", "session_id", "pid"):
        assert parse_event({"type": "completion", key: "p1"}).process_id == "p1"
    assert parse_event({"type": "completion", "duration": 4}).duration_seconds == 4
    # the canonical spelling wins over a legacy one; empty values fall through
    legacy = {"type": "completion", "exit_code": None, "returncode": 3, "output": "", "tail": "t"}
    assert (parse_event(legacy).exit_code, parse_event(legacy).output_tail) == (3, "t")


def _row(**columns: Any) -> LedgerRow:
    """A ledger row of the given columns, every other one None."""
    return LedgerRow(**{**dict.fromkeys(COLUMNS), **columns})


def test_abandoned_work_as_the_ledger_writes_it() -> None:
    row = _row(
        id="deleg_dead",
        kind="delegation",
        request={"type": "async_delegation", "goal": "g", "delegation_id": "deleg_dead"},
        started_at=100.0,
        created_at=90.0,
    )
    for state in ("interrupted", "unknown"):
        evt = parse_event(abandoned_event(row, state, 160.0))
        assert isinstance(evt, AbandonedWork) and evt.kind == "abandoned"
        assert evt.status == state and evt.never_started is (state == "interrupted")
        assert isinstance(evt.work, DelegationEvent) and evt.work.goal == "g"
        assert delivery_id(evt) == "deleg_dead"
    proc = _row(id="proc_x", kind="process", request={"command": "sleep 9"}, created_at=1)
    evt = parse_event(abandoned_event(proc, "unknown", 5.0))
    assert isinstance(evt, AbandonedWork) and isinstance(evt.work, ProcessCompletionEvent)
    assert evt.work.command == "sleep 9" and delivery_id(evt) == "proc_x"
    meta = display_metadata(evt)
    assert meta["kind"] == "abandoned" and meta["work_kind"] == "process"
    assert meta["abandoned"] is True and meta["status"] == "unknown" and "error" in meta


def test_generic_and_untyped_events_keep_the_raw_dict() -> None:
    evt = parse_event({"type": "watch_match", "pattern": "ERROR"})
    assert isinstance(evt, GenericEvent) and evt.type == "watch_match"
    assert evt.raw["pattern"] == "ERROR"
    untyped = parse_event({"goal": "x"})
    assert isinstance(untyped, GenericEvent) and untyped.type is None


def test_restored_mark_is_the_ledgers_field() -> None:
    assert parse_event(mark_reoffered(SINGLE, "restart", 1.0)).restored
    assert not parse_event({**SINGLE, "restored": 1}).restored


@pytest.mark.parametrize(
    "raw",
    [SINGLE, BATCH, PROCESS, {"type": "watch_match", "n": 1}, {"returncode": 1, "cmd": "x"}],
)
def test_round_trip_to_the_same_wire_dict(raw: dict) -> None:
    evt = parse_event(raw)
    assert evt.to_dict() == raw
    assert parse_event(evt.to_dict()) == evt
    assert parse_event(evt) is evt
    out = evt.to_dict()
    out["status"] = "mutated"
    assert raw.get("status") != "mutated"  # to_dict hands out a copy


def test_a_changed_field_lands_under_its_canonical_key() -> None:
    evt = dataclasses.replace(parse_event({"type": "completion", "returncode": 1}), exit_code=0)
    assert evt.to_dict() == {"type": "completion", "returncode": 1, "exit_code": 0}
    built = DelegationEvent(type=ASYNC_DELEGATION, delegation_id="deleg_1", goal="g")
    assert built.to_dict() == {"type": "async_delegation", "delegation_id": "deleg_1", "goal": "g"}
    assert parse_event(built.to_dict()).goal == "g"


def test_delivery_id() -> None:
    assert delivery_id(SINGLE) == delivery_id(parse_event(SINGLE)) == "deleg_00ff"
    assert delivery_id(PROCESS) == "proc_1234"
    assert delivery_id({"type": "watch_match"}) is None  # needs no claim
    with pytest.raises(ValueError, match="no delegation_id"):
        delivery_id({"type": "async_delegation"})
    with pytest.raises(TypeError):
        delivery_id({"type": "completion", "delivery_id": 5})
    with pytest.raises(TypeError):
        delivery_id("not an event")
    # the lenient form (logs, idempotency keys: gateway.run's _event_id) never raises
    assert delivery_id({"type": "completion", "process_id": "proc_9"}, strict=False) == "proc_9"
    assert delivery_id({"type": "async_delegation"}, strict=False) is None
    assert delivery_id(42, strict=False) is None


def test_display_metadata_of_each_kind() -> None:
    single = display_metadata(SINGLE)
    assert single["kind"] == "delegation" and single["goal"] == "count the stars"
    assert (single["tasks"], single["completed"], single["failed"]) == (1, 1, 0)
    assert single["summary"] == "About 10^24." and single["duration_seconds"] == 1.5
    assert single["delegation_id"] == "deleg_00ff" and single["is_batch"] is False
    batch = display_metadata(BATCH)
    assert batch["goals"] == ["first", "second", "third"] and batch["is_batch"] is True
    assert [r.get("goal") for r in batch["results"]] == ["first", "second", "third"]
    assert batch["results"][1]["error"] == "two broke"
    assert batch["results"][2]["result"] == "not even a dict"
    proc = display_metadata(PROCESS)
    assert proc["kind"] == "process" and proc["exit_code"] == 2 and proc["command"] == "make test"
    assert proc["output_tail"] == "a\nb\nerror: c" and proc["process_id"] == "proc_1234"
    generic = display_metadata({"type": "watch_match", "pattern": "E", "_restored": True})
    assert generic == {
        "kind": "generic",
        "type": "watch_match",
        "fields": ["pattern"],
        "restored": True,
    }
    for raw in (SINGLE, BATCH, PROCESS):
        meta = display_metadata(raw)
        assert json.loads(json.dumps(meta)) == meta


def test_display_metadata_keeps_texts_small() -> None:
    long = "\n".join(f"line {i}" for i in range(10_000))
    meta = display_metadata({**SINGLE, "summary": long})
    assert len(meta["summary"]) <= 500 and meta["summary"].endswith("…")
    tail = display_metadata({**PROCESS, "output_tail": long})["output_tail"]
    assert tail.splitlines() == [f"line {i}" for i in range(9990, 10_000)]


def _deep(levels: int) -> list:
    top: list = []
    node = top
    for _ in range(levels):
        node.append([])
        node = node[0]
    return top


@pytest.mark.parametrize("bad", [None, 3, "async_delegation", ["type"], b"{}", object()])
def test_a_non_mapping_is_a_clear_error(bad: object) -> None:
    with pytest.raises(MalformedEvent, match="must be a mapping"):
        parse_event(bad)
    with pytest.raises(MalformedEvent):
        display_metadata(bad)


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"type": None},
        {"type": 7, "status": ["x"]},
        {1: "int key", "type": "completion"},
        {"type": "async_delegation", "goal": "\ud800 lone", "summary": "\udfff", "status": "ok"},
        {"type": "completion", "exit_code": 10**5000, "duration_seconds": 10**400},
        {"type": "completion", "exit_code": 2**70, "output": float("nan")},
        {"type": "async_delegation", "delegation_id": "deleg_d", "summary": _deep(100_000)},
        {"type": "watch_match", "deep": _deep(100_000)},
        {"type": "async_delegation", "is_batch": True, "results": "nope", "goals": 5},
        {"type": "async_delegation", "toolsets": "terminal", "goals": [None, 3]},
    ],
)
def test_malformed_mappings_never_crash(raw: dict) -> None:
    from gateway.wake_text import format_wake_text

    evt = parse_event(raw)
    meta = display_metadata(evt)
    text = json.dumps(meta, ensure_ascii=False)
    text.encode("utf-8")  # storable: no lone surrogates, no NaN surprises
    assert "NaN" not in text.replace('"nan"', "")
    format_wake_text(evt, now=0).encode("utf-8", "surrogatepass")
    assert delivery_id(raw, strict=False) in (None, "deleg_d")


def test_huge_ints_stay_json_safe() -> None:
    meta = display_metadata({"type": "completion", "exit_code": 2**70})
    assert meta["exit_code"] == str(2**70)
