"""tools.async_delegation (dispatch, slots, the delivery contract) and tools.process_registry
(the completion queue, background processes), over a real ledger file."""

from __future__ import annotations

import asyncio
import os
import queue
import random
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from delivery.errors import LedgerUnavailable, UnknownDeliveryError
from delivery.policy import DeliveryPolicy
from delivery.rows import RowQuery
from delivery.write_future import WriteFuture
from reveille.settings import Settings, load_settings, state_dir
from tools.async_delegation import (
    NOT_HOLDER,
    DelegationRuntime,
    cancel_delegation,
    claim_event_delivery,
    complete_event_delivery,
    configure_runtime,
    dispatch_async_delegation,
    dispatch_async_delegation_batch,
    drop_event_delivery,
    get_durable_delegation,
    get_runtime,
    interrupt_delegation,
    list_delegations,
    open_runtime,
    register_runtime_factory,
    release_event_delivery,
    reset_runtime,
    restore_undelivered_completions,
    runtime_is_open,
)
from tools.delegation_runtime import default_state_dir
from tools.process_registry import (
    OUTPUT_TAIL_BYTES,
    CompletionQueue,
    ProcessRegistry,
    _Tail,
    process_registry,
    shared_completion_queue,
)

REPO = Path(__file__).resolve().parents[2]
WAIT = 10.0  # generous upper bound for anything that should take milliseconds


@pytest.fixture
def ledger_path(tmp_path: Path) -> str:
    return str(tmp_path / "ledger.db")


@pytest.fixture
def runtime(ledger_path: str) -> Iterator[DelegationRuntime]:
    rt = configure_runtime(ledger_path, completion_queue=CompletionQueue())
    yield rt
    reset_runtime()


class Gate:
    """A runner that blocks until the test opens its gate, recording that it ran."""

    def __init__(self, result: dict[str, Any] | None = None) -> None:
        self.opened = threading.Event()
        self.started = threading.Event()
        self.result = result or {"status": "completed", "summary": "done"}

    def __call__(self) -> dict[str, Any]:
        self.started.set()
        assert self.opened.wait(WAIT), "gate never opened"
        return self.result

    def open(self) -> None:
        self.opened.set()


def dispatch(runner: Callable[[], dict[str, Any]], goal: str = "task", **kw: Any) -> dict:
    return dispatch_async_delegation(goal=goal, runner=runner, session_key="agent:main:s1", **kw)


def next_event(rt: DelegationRuntime, timeout: float = WAIT) -> dict[str, Any]:
    return rt.queue.get(timeout=timeout)


def wait_for(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.002)


# -- dispatch -------------------------------------------------------------------------------


class TestDispatch:
    def test_dispatch_returns_at_once_and_the_completion_comes_later(
        self, runtime: DelegationRuntime
    ) -> None:
        gate = Gate({"status": "completed", "summary": "42 files"})
        started = time.monotonic()
        res = dispatch(gate, goal="count files", context="in /src", toolsets=["files"])
        assert time.monotonic() - started < 0.5
        assert res["status"] == "dispatched"
        assert re.fullmatch(r"deleg_[0-9a-f]+", res["delegation_id"])
        row = get_durable_delegation(res["delegation_id"])
        assert row is not None
        # The row was written before the work could start.
        assert row["state"] == "running" and row["delivery_state"] == "pending"
        assert row["event"] is None and row["session_key"] == "agent:main:s1"
        assert runtime.queue.empty()
        gate.open()
        evt = next_event(runtime)
        assert evt["type"] == "async_delegation"
        assert evt["delegation_id"] == res["delegation_id"]
        assert (evt["goal"], evt["context"], evt["toolsets"]) == (
            "count files",
            "in /src",
            ["files"],
        )
        assert evt["status"] == "completed" and evt["summary"] == "42 files"
        assert evt["dispatched_at"] <= evt["completed_at"] and evt["duration_seconds"] >= 0
        row = get_durable_delegation(res["delegation_id"])
        assert row is not None and row["state"] == "completed" and row["event"] == evt
        assert [r["id"] for r in list_delegations(session="agent:main:s1")] == [
            res["delegation_id"]
        ]

    def test_a_cap_of_three_running_then_a_bounded_fifo_then_rejection(
        self, ledger_path: str
    ) -> None:
        rt = configure_runtime(ledger_path, completion_queue=CompletionQueue(), max_queued=2)
        try:
            order: list[str] = []
            lock = threading.Lock()
            running = [0]
            peak = [0]

            def runner(name: str, gate: Gate) -> Callable[[], dict[str, Any]]:
                def run() -> dict[str, Any]:
                    with lock:
                        order.append(name)
                        running[0] += 1
                        peak[0] = max(peak[0], running[0])
                    try:
                        return gate()
                    finally:
                        with lock:
                            running[0] -= 1

                return run

            gates = [Gate() for _ in range(5)]
            results = [dispatch(runner(f"u{i}", gates[i])) for i in range(5)]
            assert [r["status"] for r in results] == ["dispatched"] * 3 + ["queued"] * 2
            for r in results[3:]:
                assert get_durable_delegation(r["delegation_id"])["state"] == "queued"  # type: ignore[index]
            rejected = dispatch(Gate())
            assert rejected["status"] == "rejected" and "limit" in rejected["error"]
            assert get_durable_delegation(rejected["delegation_id"]) is None  # nothing written
            assert (rt.running_count(), rt.waiting_count()) == (3, 2)
            for i in range(3):
                assert gates[i].started.wait(WAIT)
            gates[1].open()
            assert gates[3].started.wait(WAIT)  # first in, first out
            assert not gates[4].started.is_set()
            for g in gates:
                g.open()
            events = [next_event(rt) for _ in range(5)]
            assert {e["delegation_id"] for e in events} == {r["delegation_id"] for r in results}
            assert order[:3] == ["u0", "u1", "u2"] and order[3:] == ["u3", "u4"]
            assert peak[0] <= 3
            wait_for(lambda: rt.running_count() == 0)
        finally:
            reset_runtime()

    def test_a_batch_takes_one_slot_and_reports_once(self, runtime: DelegationRuntime) -> None:
        singles = [Gate(), Gate()]
        for g in singles:
            assert dispatch(g)["status"] == "dispatched"
        gates = [Gate(), Gate({"status": "failed", "error": "no network"}), Gate()]
        batch = dispatch_async_delegation_batch(
            goals=["read", "fetch", "write"], runners=list(gates), session_key="s"
        )
        assert batch["status"] == "dispatched"  # three goals, one slot: the third
        assert runtime.running_count() == 3
        assert dispatch(Gate())["status"] == "queued"
        for g in gates:
            g.open()
        evt = next_event(runtime)
        assert evt["delegation_id"] == batch["delegation_id"] and evt["is_batch"] is True
        assert evt["goals"] == ["read", "fetch", "write"]
        assert [r["task_index"] for r in evt["results"]] == [0, 1, 2]
        assert [r["goal"] for r in evt["results"]] == ["read", "fetch", "write"]
        assert [r["status"] for r in evt["results"]] == ["completed", "failed", "completed"]
        assert evt["status"] == "failed" and evt["total_duration_seconds"] >= 0
        row = get_durable_delegation(batch["delegation_id"])
        assert row is not None and row["state"] == "failed"
        for g in singles:
            g.open()

    def test_a_batch_with_one_runner_all_completed(self, runtime: DelegationRuntime) -> None:
        results = [{"status": "completed", "summary": str(i)} for i in range(2)]
        res = dispatch_async_delegation_batch(goals=["a", "b"], runner=lambda: {"results": results})
        evt = next_event(runtime)
        assert evt["delegation_id"] == res["delegation_id"]
        assert evt["status"] == "completed" and evt["results"] == results

    def test_the_terminal_row_is_written_before_the_event_is_queued(self, ledger_path: str) -> None:
        seen: list[tuple[dict[str, Any], dict[str, Any] | None]] = []

        class CheckingQueue(CompletionQueue):
            def put(self, item: dict[str, Any], block: bool = True, timeout: Any = None) -> None:
                seen.append((item, get_durable_delegation(item["delegation_id"])))
                super().put(item, block, timeout)

        rt = configure_runtime(ledger_path, completion_queue=CheckingQueue())
        try:
            ids = [
                dispatch(lambda i=i: {"status": "completed", "summary": f"r{i}"})["delegation_id"]
                for i in range(3)
            ]
            ids.append(dispatch(lambda: 1 / 0)["delegation_id"])
            events = [next_event(rt) for _ in range(4)]
            assert {e["delegation_id"] for e in events} == set(ids)
            for item, row in seen:
                assert row is not None, "event queued before its row existed"
                assert row["state"] == item["status"] != "running"
                assert row["delivery_state"] == "pending" and row["event"] == item
        finally:
            reset_runtime()

    @pytest.mark.parametrize(
        ("runner", "status", "error"),
        [
            (lambda: 1 / 0, "error", "ZeroDivisionError: division by zero"),
            (lambda: "not a dict", "error", "runner returned str"),
            (lambda: {"status": "exploded"}, "error", "unknown status 'exploded'"),
            (lambda: {"status": "failed", "error": "tests red"}, "failed", "tests red"),
            (lambda: {"summary": "implicit"}, "completed", None),
        ],
    )
    def test_runner_outcomes(
        self, runtime: DelegationRuntime, runner: Any, status: str, error: str | None
    ) -> None:
        res = dispatch(runner)
        evt = next_event(runtime)
        assert evt["delegation_id"] == res["delegation_id"] and evt["status"] == status
        if error is None:
            assert "error" not in evt
        else:
            assert error in evt["error"]
        assert get_durable_delegation(res["delegation_id"])["state"] == status  # type: ignore[index]
        wait_for(lambda: runtime.running_count() == 0)

    def test_cancel_of_a_queued_unit_never_runs_it(self, runtime: DelegationRuntime) -> None:
        gates = [Gate() for _ in range(3)]
        for g in gates:
            dispatch(g)
        never = Gate()
        queued = dispatch(never)
        assert queued["status"] == "queued"
        assert cancel_delegation(queued["delegation_id"]) is True
        evt = next_event(runtime)
        assert evt["delegation_id"] == queued["delegation_id"] and evt["status"] == "cancelled"
        row = get_durable_delegation(queued["delegation_id"])
        assert row is not None and row["state"] == "cancelled" and row["event"] == evt
        for g in gates:
            g.open()
        for _ in range(3):
            assert next_event(runtime)["status"] == "completed"
        wait_for(lambda: runtime.running_count() == 0)
        assert not never.started.is_set() and runtime.waiting_count() == 0
        assert cancel_delegation(queued["delegation_id"]) is False  # gone from the slots
        assert cancel_delegation("deleg_nope") is False

    def test_cancel_and_interrupt_of_a_running_unit(self, runtime: DelegationRuntime) -> None:
        stop = threading.Event()

        def runner() -> dict[str, Any]:
            stop.wait(WAIT)
            return {"status": "completed", "summary": "stopped early"}

        res = dispatch(runner, interrupt_fn=stop.set)
        assert cancel_delegation(res["delegation_id"]) is True
        evt = next_event(runtime)
        assert evt["status"] == "cancelled" and evt["summary"] == "stopped early"
        stop.clear()
        res2 = dispatch(runner, interrupt_fn=stop.set)
        assert interrupt_delegation(res2["delegation_id"]) is True
        assert next_event(runtime)["status"] == "completed"  # interrupted, not cancelled

    def test_bad_dispatch_arguments_write_nothing(self, runtime: DelegationRuntime) -> None:
        ok = Gate()
        with pytest.raises(ValueError, match="goal"):
            dispatch_async_delegation(goal="  ", runner=ok)
        with pytest.raises(TypeError, match="runner"):
            dispatch_async_delegation(goal="g", runner="not callable")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="toolsets"):
            dispatch_async_delegation(goal="g", runner=ok, toolsets="files")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="session_key"):
            dispatch_async_delegation(goal="g", runner=ok, session_key=7)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_async_children"):
            dispatch_async_delegation(goal="g", runner=ok, max_async_children=0)
        with pytest.raises(ValueError, match="goals"):
            dispatch_async_delegation_batch(goals=[], runner=ok)
        with pytest.raises(TypeError, match="exactly one"):
            dispatch_async_delegation_batch(goals=["a"], runner=ok, runners=[ok])
        with pytest.raises(ValueError, match="one callable per goal"):
            dispatch_async_delegation_batch(goals=["a", "b"], runners=[ok])
        assert list_delegations() == [] and runtime.running_count() == 0

    def test_a_failed_ledger_write_rejects_the_dispatch(
        self, runtime: DelegationRuntime, ledger_path: str
    ) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(ledger_path + suffix).unlink(missing_ok=True)
        gate = Gate()
        res = dispatch(gate)
        assert res["status"] == "rejected" and "could not record" in res["error"]
        assert runtime.running_count() == 0 and runtime.waiting_count() == 0
        time.sleep(0.05)
        assert not gate.started.is_set()  # work that was not recorded never starts

    def test_workers_never_block_process_exit(self, tmp_path: Path) -> None:
        script = textwrap.dedent(
            f"""
            import sys, time
            sys.path.insert(0, {str(REPO)!r})
            from tools.async_delegation import configure_runtime, dispatch_async_delegation
            from tools.process_registry import CompletionQueue
            configure_runtime({str(tmp_path / "l.db")!r}, completion_queue=CompletionQueue())
            r = dispatch_async_delegation(goal="g", runner=lambda: time.sleep(60) or {{}})
            print(r["status"], flush=True)
            """
        )
        started = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "dispatched"
        assert time.monotonic() - started < 10

    def test_without_a_factory_the_runtime_opens_on_the_state_directory(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # The default is built on the tools floor alone: the state directory's ledger file,
        # the default delivery policy and queue limit, the shared completion queue.
        reset_runtime()
        previous = register_runtime_factory(None)
        monkeypatch.setenv("REVEILLE_HOME", str(tmp_path / "home"))
        try:
            rt = get_runtime()
            assert runtime_is_open()
            assert rt.ledger.backend.path == str((tmp_path / "home" / "ledger.db").resolve())
            assert rt.ledger.policy == DeliveryPolicy()
            assert rt.max_queued == Settings().max_queued_delegations == 32
            assert rt.queue is process_registry.completion_queue is shared_completion_queue
            assert get_runtime() is rt
        finally:
            reset_runtime()
            register_runtime_factory(previous)
        assert not runtime_is_open()

    def test_the_default_state_directory_is_the_settings_one(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("REVEILLE_HOME", raising=False)
        monkeypatch.setenv("HOME", str(tmp_path))
        assert default_state_dir() == tmp_path / ".reveille" == state_dir()
        monkeypatch.setenv("REVEILLE_HOME", "~/elsewhere")
        assert default_state_dir() == tmp_path / "elsewhere" == state_dir()

    def test_a_registered_factory_opens_the_runtime_from_the_settings(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # What the composition root registers: the runtime of the settings.
        def from_settings() -> DelegationRuntime:
            s = load_settings()
            calls.append(s)
            return open_runtime(
                str(s.ledger_path), policy=s.delivery_policy, max_queued=s.max_queued_delegations
            )

        calls: list[Settings] = []
        reset_runtime()
        monkeypatch.setenv("REVEILLE_HOME", str(tmp_path / "home"))
        monkeypatch.setenv("REVEILLE_MAX_ATTEMPTS", "2")
        monkeypatch.setenv("REVEILLE_LEASE_SECONDS", "30")
        monkeypatch.setenv("REVEILLE_REPLAY_CAP_SECONDS", "3600")
        monkeypatch.setenv("REVEILLE_MAX_QUEUED_DELEGATIONS", "5")
        monkeypatch.delenv("REVEILLE_CONFIG", raising=False)
        previous = register_runtime_factory(from_settings)
        try:
            rt = get_runtime()
            assert rt.ledger.backend.path == str((tmp_path / "home" / "ledger.db").resolve())
            policy = rt.ledger.policy
            assert (policy.max_attempts, policy.lease_seconds, policy.replay_cap_seconds) == (
                2,
                30.0,
                3600.0,
            )
            assert rt.max_queued == 5 and rt.queue is process_registry.completion_queue
            assert get_runtime() is rt and len(calls) == 1  # opened once
            reset_runtime()
            assert get_runtime() is not rt and len(calls) == 2  # the factory outlives a reset
        finally:
            reset_runtime()
            assert register_runtime_factory(previous) is from_settings

    def test_a_queued_unit_is_not_lost_when_a_slot_frees_while_its_row_is_written(
        self, runtime: DelegationRuntime
    ) -> None:
        gates = [Gate() for _ in range(3)]
        for g in gates:
            assert dispatch(g)["status"] == "dispatched"
            assert g.started.wait(WAIT)
        real_create = runtime.ledger.create

        def create_while_a_slot_frees(row_id: str, **kw: Any) -> dict[str, Any]:
            if kw.get("state") == "queued":
                gates[0].open()  # a running unit finishes while this row is being written
                deadline = time.monotonic() + 2
                while runtime.waiting_count() and time.monotonic() < deadline:
                    time.sleep(0.002)
            return real_create(row_id, **kw)

        runtime.ledger.create = create_while_a_slot_frees  # type: ignore[method-assign]
        fourth = dispatch(lambda: {"status": "completed", "summary": "fourth"})
        runtime.ledger.create = real_create  # type: ignore[method-assign]
        assert fourth["status"] == "queued"
        gates[1].open()
        gates[2].open()
        done = set()
        try:
            for _ in range(4):
                done.add(next_event(runtime, timeout=1)["delegation_id"])
        except queue.Empty:
            pass
        row = get_durable_delegation(fourth["delegation_id"])
        assert fourth["delegation_id"] in done, f"the queued unit never ran: row {row}"


class TestDrain:
    def test_a_drain_waits_for_a_finished_units_event_not_only_its_slot(
        self, runtime: DelegationRuntime
    ) -> None:
        """The slot frees before the terminal row commits; a drain that returned then would
        let the server stop before the finished work's completion was even queued."""
        real_finish = runtime.ledger.submit_finish
        release = threading.Event()

        def held_finish(row_id: str, **kw: Any) -> Any:
            held: WriteFuture[bool] = WriteFuture()

            def commit_later() -> None:
                release.wait(WAIT)
                try:
                    held._settle(True, real_finish(row_id, **kw).result(WAIT))
                except BaseException as exc:
                    held._settle(False, exc)

            threading.Thread(target=commit_later, daemon=True).start()
            return held

        runtime.ledger.submit_finish = held_finish  # type: ignore[method-assign]
        gate = Gate()
        res = dispatch(gate)
        gate.open()
        wait_for(lambda: not runtime._slots.running)  # the slot is free, the row not written
        drained: list[tuple[int, list[str]]] = []
        drainer = threading.Thread(target=lambda: drained.append(runtime.drain(WAIT)))
        drainer.start()
        drainer.join(0.3)
        assert drainer.is_alive() and runtime.queue.empty()
        release.set()
        drainer.join(WAIT)
        assert drained == [(0, [])]  # it had finished (its slot freed) before the drain began
        # Queued before the drain returned: the server delivers it before stopping.
        assert runtime.queue.get_nowait()["delegation_id"] == res["delegation_id"]


# -- the delivery contract --------------------------------------------------------------------


@pytest.fixture
def finished(runtime: DelegationRuntime) -> dict[str, Any]:
    dispatch(lambda: {"status": "completed", "summary": "ok"})
    return next_event(runtime)


class TestContract:
    def test_claim_complete_exactly_once(self, finished: dict[str, Any]) -> None:
        claim = claim_event_delivery(finished, "gateway")
        assert isinstance(claim, str) and claim
        assert claim_event_delivery(finished, "webui") is None  # held by someone else
        row = get_durable_delegation(finished["delegation_id"])
        assert row is not None and row["delivery_attempts"] == 1
        assert complete_event_delivery(finished, claim) is True
        row = get_durable_delegation(finished["delegation_id"])
        assert row is not None and row["delivery_state"] == "delivered"
        assert claim_event_delivery(finished, "webui") is None  # settled
        assert release_event_delivery(finished, "f" * 32) == NOT_HOLDER  # a foreign claim
        assert release_event_delivery(finished, claim) == "delivered"  # the holder's own

    def test_event_types_that_need_no_claim(self, runtime: DelegationRuntime) -> None:
        evt = {"type": "watch_match", "pattern": "ERROR"}
        assert claim_event_delivery(evt, "c") == ""
        assert complete_event_delivery(evt, "") is True
        assert release_event_delivery(evt, "") == "pending"
        assert release_event_delivery(evt, "", retryable=True) == "pending"
        assert drop_event_delivery(evt, "", "gone") is False
        assert list_delegations() == []

    def test_wrong_claims_write_nothing(self, finished: dict[str, Any]) -> None:
        row_id = finished["delegation_id"]
        claim = claim_event_delivery(finished, "gateway")
        assert claim
        before = get_durable_delegation(row_id)
        # Not the holder: complete, release and drop answer with a false value.
        assert complete_event_delivery(finished, "0" * 32) is False
        assert release_event_delivery(finished, "0" * 32) == NOT_HOLDER
        assert release_event_delivery(finished, "0" * 32, retryable=True) == NOT_HOLDER
        assert drop_event_delivery(finished, "0" * 32, "gone") is False
        for call in (
            lambda: complete_event_delivery(finished, None),
            lambda: release_event_delivery(finished, None),
        ):
            with pytest.raises(ValueError, match="claim token"):
                call()
        assert get_durable_delegation(row_id) == before
        assert complete_event_delivery(finished, claim) is True

    @pytest.mark.parametrize(
        ("evt", "error", "match"),
        [
            ({"type": "async_delegation"}, ValueError, "no delegation_id"),
            ({"type": "async_delegation", "delegation_id": None}, ValueError, "no delegation_id"),
            ({"type": "async_delegation", "delegation_id": 7}, TypeError, "non-empty string"),
            ({"type": "async_delegation", "delegation_id": ""}, TypeError, "non-empty string"),
            ({"type": "completion", "delivery_id": ["x"]}, TypeError, "non-empty string"),
            ("deleg_abc", TypeError, "must be a dict"),
            (None, TypeError, "must be a dict"),
            ([("type", "async_delegation")], TypeError, "must be a dict"),
        ],
    )
    def test_malformed_events_get_clear_errors(
        self, finished: dict[str, Any], evt: Any, error: type[Exception], match: str
    ) -> None:
        before = get_durable_delegation(finished["delegation_id"])
        for call in (
            lambda: claim_event_delivery(evt, "c"),
            lambda: complete_event_delivery(evt, "t"),
            lambda: release_event_delivery(evt, "t"),
            lambda: release_event_delivery(evt, "t", retryable=True),
        ):
            with pytest.raises(error, match=match):
                call()
        assert get_durable_delegation(finished["delegation_id"]) == before

    def test_unknown_ids_and_bad_consumers(self, finished: dict[str, Any]) -> None:
        ghost = {**finished, "delegation_id": "deleg_00000000000000"}
        with pytest.raises(UnknownDeliveryError, match="deleg_00000000000000"):
            claim_event_delivery(ghost, "c")
        with pytest.raises(UnknownDeliveryError):
            complete_event_delivery(ghost, "t")
        with pytest.raises(UnknownDeliveryError):
            release_event_delivery(ghost, "t")
        assert get_durable_delegation("deleg_00000000000000") is None
        with pytest.raises(TypeError):
            get_durable_delegation(42)  # type: ignore[arg-type]
        for consumer in ("", None, 5):
            with pytest.raises(TypeError, match="consumer"):
                claim_event_delivery(finished, consumer)  # type: ignore[arg-type]
        row = get_durable_delegation(finished["delegation_id"])
        assert row is not None and row["delivery_attempts"] == 0

    def test_an_empty_claim_for_an_event_that_needs_one_is_refused(
        self, finished: dict[str, Any]
    ) -> None:
        claim = claim_event_delivery(finished, "gateway")
        assert claim
        with pytest.raises((ValueError, TypeError)):
            complete_event_delivery(finished, "")
        with pytest.raises((ValueError, TypeError)):
            release_event_delivery(finished, "")

    def test_retryable_release_refunds_the_attempt(self, finished: dict[str, Any]) -> None:
        row_id = finished["delegation_id"]
        claim = claim_event_delivery(finished, "webui")
        assert claim
        assert get_durable_delegation(row_id)["delivery_attempts"] == 1  # type: ignore[index]
        assert release_event_delivery(finished, claim, retryable=True) == "pending"
        row = get_durable_delegation(row_id)
        assert row is not None
        assert (row["delivery_attempts"], row["refunds"]) == (0, 1)
        assert row["next_attempt_at"] > time.time()  # backing off, not hot
        assert claim_event_delivery(finished, "webui") is None
        assert get_durable_delegation(row_id)["delivery_attempts"] == 0  # type: ignore[index]

    def test_ordinary_release_keeps_the_attempt(self, finished: dict[str, Any]) -> None:
        claim = claim_event_delivery(finished, "webui")
        assert claim
        assert release_event_delivery(finished, claim) == "pending"
        row = get_durable_delegation(finished["delegation_id"])
        assert row is not None and (row["delivery_attempts"], row["refunds"]) == (1, 0)

    def test_drop_settles_and_keeps_the_result(self, finished: dict[str, Any]) -> None:
        claim = claim_event_delivery(finished, "webui")
        assert drop_event_delivery(finished, claim, "session deleted") is True
        row = get_durable_delegation(finished["delegation_id"])
        assert row is not None and row["delivery_state"] == "dropped"
        assert row["event"]["summary"] == "ok"
        assert claim_event_delivery(finished, "webui") is None

    def test_restore_after_a_restart_offers_pending_completions(
        self, runtime: DelegationRuntime, ledger_path: str
    ) -> None:
        ids = []
        for i in range(3):
            ids.append(dispatch(lambda i=i: {"status": "completed", "summary": str(i)}))
            next_event(runtime)  # the old process received them but never delivered
        delivered = get_durable_delegation(ids[0]["delegation_id"])
        assert delivered is not None
        evt0 = delivered["event"]
        assert complete_event_delivery(evt0, claim_event_delivery(evt0, "c"))
        configure_runtime(ledger_path, completion_queue=CompletionQueue())  # "restart"
        fresh: queue.Queue[dict[str, Any]] = queue.Queue()
        assert restore_undelivered_completions(fresh) == 2
        restored = [fresh.get_nowait() for _ in range(2)]
        assert [e["delegation_id"] for e in restored] == [r["delegation_id"] for r in ids[1:]]
        for evt in restored:
            assert evt["_restored"] is True
            claim = claim_event_delivery(evt, "after-restart")
            assert claim and complete_event_delivery(evt, claim)
        assert restore_undelivered_completions(fresh) == 0


# -- the completion queue ---------------------------------------------------------------------


class CountingCondition:
    """Wraps the queue's condition to count how often anyone takes its lock."""

    def __init__(self, inner: threading.Condition) -> None:
        self.inner = inner
        self.entries = 0

    def __enter__(self) -> Any:
        self.entries += 1
        return self.inner.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self.inner.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class TestCompletionQueue:
    def test_fifo_and_timeouts(self) -> None:
        q = CompletionQueue()
        for i in range(5):
            q.put({"n": i})
        assert q.qsize() == 5 and not q.empty()
        assert [q.get(timeout=1)["n"] for _ in range(5)] == [0, 1, 2, 3, 4]
        started = time.monotonic()
        with pytest.raises(queue.Empty):
            q.get(timeout=0.1)
        assert time.monotonic() - started >= 0.09
        with pytest.raises(queue.Empty):
            q.get_nowait()

    def test_a_blocked_thread_get_wakes_on_put(self) -> None:
        q = CompletionQueue()
        got: list[dict[str, Any]] = []
        th = threading.Thread(target=lambda: got.append(q.get(timeout=WAIT)))
        th.start()
        time.sleep(0.05)
        q.put({"n": 1})
        th.join(WAIT)
        assert got == [{"n": 1}]

    async def test_get_async_wakes_on_a_thread_put_without_polling(self) -> None:
        q = CompletionQueue()
        counting = CountingCondition(q._cond)
        q._cond = counting  # type: ignore[assignment]
        task = asyncio.create_task(q.get_async())
        await asyncio.sleep(0.05)
        entries = counting.entries
        cpu = time.thread_time()
        await asyncio.sleep(0.3)  # idle: a poller would keep taking the lock or spin the loop
        assert counting.entries == entries
        assert time.thread_time() - cpu < 0.05
        put_at: list[float] = []

        def producer() -> None:
            put_at.append(time.monotonic())
            q.put({"n": "from a thread"})

        threading.Thread(target=producer).start()
        item = await asyncio.wait_for(task, WAIT)
        assert item == {"n": "from a thread"}
        assert time.monotonic() - put_at[0] < 0.1

    async def test_a_cancelled_get_async_never_loses_an_item(self) -> None:
        q = CompletionQueue()
        rng = random.Random(1234)
        for i in range(300):
            waiter = asyncio.create_task(q.get_async())
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)
            item = {"n": i}
            if rng.random() < 0.5:
                q.put(item)
            else:
                th = threading.Thread(target=q.put, args=(item,))
                th.start()
                th.join()
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)
            waiter.cancel()
            try:
                got = await waiter
            except asyncio.CancelledError:
                got = None
            left = q.drain()
            # The item went to the waiter or is still queued: never both, never neither.
            assert (got == item) != (left == [item]), (i, got, left)

    async def test_every_item_reaches_exactly_one_of_many_async_consumers(self) -> None:
        q = CompletionQueue()
        n = 200
        got: list[int] = []

        async def consumer() -> None:
            while True:
                got.append((await q.get_async())["n"])

        consumers = [asyncio.create_task(consumer()) for _ in range(4)]
        await asyncio.sleep(0.01)

        def producer(start: int) -> None:
            for i in range(start, n, 2):
                q.put({"n": i})

        threads = [threading.Thread(target=producer, args=(s,)) for s in (0, 1)]
        for th in threads:
            th.start()
        deadline = time.monotonic() + WAIT
        while len(got) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for th in threads:
            th.join()
        for c in consumers:
            c.cancel()
        await asyncio.gather(*consumers, return_exceptions=True)
        assert sorted(got) == list(range(n)) and q.empty()

    def test_put_to_a_closed_loops_waiter_does_not_raise(self) -> None:
        q = CompletionQueue()
        loop = asyncio.new_event_loop()

        async def start_waiting() -> asyncio.Task[dict[str, Any]]:
            task = asyncio.create_task(q.get_async())
            await asyncio.sleep(0)
            return task

        task = loop.run_until_complete(start_waiting())
        task.cancel()
        loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
        loop.close()
        q.put({"n": 1})
        assert q.get_nowait() == {"n": 1}


# -- background processes ---------------------------------------------------------------------


@pytest.fixture
def registry(runtime: DelegationRuntime) -> ProcessRegistry:
    return ProcessRegistry()


def wait_terminal(process_id: str) -> dict[str, Any]:
    def done() -> bool:
        row = get_durable_delegation(process_id)
        return row is not None and row["state"] not in ("queued", "running")

    wait_for(done)
    row = get_durable_delegation(process_id)
    assert row is not None
    return row


class TestProcessRegistry:
    def test_spawn_runs_a_real_process_and_records_its_completion(
        self, registry: ProcessRegistry
    ) -> None:
        seen: list[dict[str, Any] | None] = []

        class CheckingQueue(CompletionQueue):
            def put(self, item: dict[str, Any], block: bool = True, timeout: Any = None) -> None:
                seen.append(get_durable_delegation(item["delivery_id"]))
                super().put(item, block, timeout)

        registry.completion_queue = CheckingQueue()
        info = registry.spawn("echo hello; echo oops >&2; exit 3", session_key="s1")
        assert info["status"] == "running" and info["pid"] > 0
        assert info["process_id"].startswith("proc_")
        evt = registry.completion_queue.get(timeout=WAIT)
        assert evt["type"] == "completion" and evt["delivery_id"] == info["process_id"]
        assert evt["exit_code"] == 3 and evt["status"] == "failed"
        assert evt["output_tail"] == "hello\noops\n" and evt["output_bytes"] == 11
        assert evt["session_key"] == "s1" and evt["duration_seconds"] >= 0
        assert seen and seen[0] is not None and seen[0]["state"] == "failed"  # row first
        row = get_durable_delegation(info["process_id"])
        assert row is not None and row["event"] == evt and row["delivery_state"] == "pending"
        claim = claim_event_delivery(evt, "gateway")
        assert claim and complete_event_delivery(evt, claim)
        assert get_durable_delegation(info["process_id"])["delivery_state"] == "delivered"  # type: ignore[index]
        polled = registry.poll(info["process_id"])
        assert polled is not None and polled["exit_code"] == 3

    def test_exit_zero_is_completed(self, registry: ProcessRegistry) -> None:
        info = registry.spawn("true")
        evt = registry.completion_queue.get(timeout=WAIT)
        assert evt["delivery_id"] == info["process_id"]
        assert (evt["status"], evt["exit_code"], evt["output_tail"]) == ("completed", 0, "")

    def test_the_output_tail_is_bounded(self, registry: ProcessRegistry) -> None:
        cmd = f"{sys.executable} -c \"import sys; sys.stdout.write('x' * 100000 + 'END')\""
        registry.spawn(cmd)
        evt = registry.completion_queue.get(timeout=WAIT)
        assert evt["output_bytes"] == 100003
        assert len(evt["output_tail"]) == OUTPUT_TAIL_BYTES
        assert evt["output_tail"].endswith("xEND")

    def test_the_tail_keeps_bounded_memory(self) -> None:
        tail = _Tail(limit=1000)
        for i in range(5000):
            tail.feed(f"{i:06d}\n".encode())
        assert tail.total == 5000 * 7
        assert sum(len(c) for c in tail._chunks) < 1000 + 7  # not everything it was fed
        assert tail.text().endswith("004999\n") and len(tail.text()) == 1000

    def test_without_notify_nothing_is_queued_but_the_result_is_kept(
        self, registry: ProcessRegistry
    ) -> None:
        info = registry.spawn("echo quiet", notify_on_complete=False)
        row = wait_terminal(info["process_id"])
        wait_for(lambda: get_durable_delegation(info["process_id"])["delivery_state"] != "pending")  # type: ignore[index]
        row = get_durable_delegation(info["process_id"])
        assert row is not None
        assert row["state"] == "completed" and row["delivery_state"] == "dropped"
        assert row["event"]["output_tail"] == "quiet\n"
        time.sleep(0.05)
        assert registry.completion_queue.empty()
        polled = registry.poll(info["process_id"])
        assert polled is not None
        assert polled["exit_code"] == 0 and polled["output_tail"] == "quiet\n"
        assert restore_undelivered_completions(CompletionQueue()) == 0

    def test_kill_and_poll_a_running_process(self, registry: ProcessRegistry) -> None:
        info = registry.spawn("sleep 30")
        polled = registry.poll(info["process_id"])
        assert polled is not None and polled["status"] == "running"
        assert [p["process_id"] for p in registry.list_running()] == [info["process_id"]]
        assert registry.kill(info["process_id"]) is True
        evt = registry.completion_queue.get(timeout=WAIT)
        assert evt["status"] == "cancelled" and evt["exit_code"] != 0
        assert registry.list_running() == []
        assert registry.kill(info["process_id"]) is False
        assert registry.kill("proc_nope") is False
        assert registry.poll("proc_nope") is None

    def test_a_timeout_kills_the_process(self, registry: ProcessRegistry) -> None:
        started = time.monotonic()
        registry.spawn("sleep 30", timeout=0.2)
        evt = registry.completion_queue.get(timeout=WAIT)
        assert evt["status"] == "cancelled" and time.monotonic() - started < 5

    def test_a_completion_survives_a_restart(
        self, registry: ProcessRegistry, ledger_path: str
    ) -> None:
        info = registry.spawn("echo durable")
        registry.completion_queue.get(timeout=WAIT)  # received, never delivered
        configure_runtime(ledger_path, completion_queue=CompletionQueue())
        fresh = CompletionQueue()
        assert restore_undelivered_completions(fresh) == 1
        evt = fresh.get_nowait()
        assert evt["delivery_id"] == info["process_id"] and evt["output_tail"] == "durable\n"
        claim = claim_event_delivery(evt, "after-restart")
        assert claim and complete_event_delivery(evt, claim)

    def test_bad_commands(self, registry: ProcessRegistry) -> None:
        for bad in ("", "   ", None, 3):
            with pytest.raises(ValueError, match="command"):
                registry.spawn(bad)  # type: ignore[arg-type]
        assert (
            list_delegations() == [] and get_runtime().ledger.query(RowQuery(kind="process")) == []
        )


def test_ledger_unavailable_is_a_clear_error_for_the_contract(ledger_path: str) -> None:
    configure_runtime(ledger_path, completion_queue=CompletionQueue())
    try:
        dispatch(lambda: {"status": "completed"})
        evt = get_runtime().queue.get(timeout=WAIT)
        get_runtime().ledger.backend.close()
        with pytest.raises(LedgerUnavailable, match="closed"):
            claim_event_delivery(evt, "c")
    finally:
        reset_runtime()
    assert os.path.exists(ledger_path)
