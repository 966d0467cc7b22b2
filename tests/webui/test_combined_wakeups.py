"""Combined wake-ups in the web UI, through the real server and its event stream: siblings
that finish together are ONE wake-up turn whose card lists each result, every row delivered
once; a result that arrives while a wake-up turn runs joins the next single wake-up; a
refused combined wake-up gives every claim back by the rule a single one follows."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import tools.async_delegation as ad
from agent.markers import WAKE_MARKER, read_wake_data
from api import config as cfg
from tests.webui.conftest import SlowDemo, settings_for, start_web, stop_web


async def _until(pred: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(pred):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


def _row(delegation_id: str) -> dict[str, Any]:
    row = ad.get_durable_delegation(delegation_id)
    assert row is not None
    return dict(row)


def _delivered(ids: list[str]) -> bool:
    return all(_row(i)["delivery_state"] == "delivered" for i in ids)


def _siblings(sid: str, summaries: list[str], gate: threading.Event | None = None) -> list[str]:
    """Background delegations of web UI session ``sid`` that run together and finish
    together (once ``gate`` opens, when one is given)."""

    def runner_for(summary: str) -> Any:
        def run() -> dict[str, Any]:
            if gate is not None:
                gate.wait(10)
            return {"status": "completed", "summary": summary}

        return run

    ids = []
    for i, summary in enumerate(summaries):
        res = ad.dispatch_async_delegation(
            goal=f"sibling {i}",
            runner=runner_for(summary),
            session_key=f"agent:main:webui:dm:{sid}",
            origin_session_id=sid,
            origin_ui_session_id=sid,
            max_async_children=len(summaries),
        )
        assert res["status"] == "dispatched", res
        ids.append(str(res["delegation_id"]))
    return ids


def _wake_messages(web: Any, sid: str) -> list[str]:
    return [
        m.content
        for m in web.app.store.messages(sid)
        if m.role == "user" and (m.display_metadata or {}).get("wake")
    ]


async def test_ten_siblings_are_one_wake_up_turn_whose_card_lists_each(tmp_path) -> None:
    web = await start_web(settings_for(tmp_path, coalesce_seconds=2.0, wake_text_budget=4000))
    try:
        sse = await web.stream()
        sid = await web.new_session("fan out")
        gate = threading.Event()
        long = "".join(f"finding {n}\n" for n in range(2000))
        summaries = [long] + [f"result of sibling {i}" for i in range(1, 10)]
        ids = await asyncio.to_thread(_siblings, sid, summaries, gate)
        gate.set()
        await _until(lambda: _delivered(ids))
        await sse.wait_for(lambda e: e[1] == "turn.end" and e[2]["session_id"] == sid)
        await asyncio.sleep(0.3)  # a second wake-up, had one started, would show by now

        [wakeup] = sse.of("wakeup")
        card = wakeup["card"]
        assert card["work_kind"] == "combined" and card["status"] == "completed"
        assert sorted(r["delivery_id"] for r in card["results"]) == sorted(ids)
        # In the order they arrived: each with its own goal.
        assert sorted(r["goal"] for r in card["results"]) == [f"sibling {i}" for i in range(10)]
        assert len([s for s in sse.of("turn.start") if s["wakeup"]]) == 1
        assert [t["goal"] for t in sse.of("toast")] == [card["goal"]]
        assert [_row(i)["delivery_attempts"] for i in ids] == [1] * 10

        # The one wake-up turn the model saw: every result, the long one cut to the budget
        # with a pointer to the full one.
        [text] = _wake_messages(web, sid)
        assert text.startswith(WAKE_MARKER)
        assert sorted(m["delegation_id"] for m in read_wake_data(text)) == sorted(ids)
        assert long not in text and f"`reveille deliveries show {ids[0]}`" in text
        for i in range(1, 10):
            assert f"result of sibling {i}" in text

        # The transcript shows it as one card listing each result, after a reload too.
        body = await web.session(sid)
        cards = [i["card"] for i in body["items"] if i["kind"] == "wakeup"]
        assert len(cards) == 1 and len(cards[0]["results"]) == 10
        assert cards[0]["delivery_id"] == card["delivery_id"]
        await sse.close()
    finally:
        await stop_web(web)


async def test_a_result_arriving_during_a_wake_up_turn_joins_the_next_one(tmp_path) -> None:
    model = SlowDemo(step=0.01)
    model.gate = asyncio.Event()
    web = await start_web(settings_for(tmp_path, coalesce_seconds=0.5), provider=model)
    try:
        sse = await web.stream()
        sid = await web.new_session("waits")
        [first] = await asyncio.to_thread(_siblings, sid, ["the first result"])
        await sse.wait_for(lambda e: e[1] == "wakeup", timeout=15)  # its turn is held

        later = await asyncio.to_thread(_siblings, sid, [f"later {i}" for i in range(3)])

        def parked() -> bool:
            with cfg.MAPS_LOCK:
                return set(later) <= set(cfg.DEFERRED_PROCESS_WAKEUPS.get(sid, {}))

        await _until(parked)
        # Waiting behind the running wake-up is not an attempt.
        assert [_row(i)["delivery_attempts"] for i in later] == [0, 0, 0]
        assert len(sse.of("wakeup")) == 1

        model.gate.set()
        await _until(lambda: _delivered([first, *later]))
        await asyncio.sleep(0.3)
        single, combined = (w["card"] for w in sse.of("wakeup"))
        assert single["delivery_id"] == first and single["work_kind"] == "delegation"
        assert combined["work_kind"] == "combined"
        assert sorted(r["delivery_id"] for r in combined["results"]) == sorted(later)
        assert [_row(i)["delivery_attempts"] for i in [first, *later]] == [1, 1, 1, 1]
        assert len(_wake_messages(web, sid)) == 2
        await sse.close()
    finally:
        await stop_web(web)


async def test_a_refused_combined_wake_up_releases_every_claim(tmp_path) -> None:
    web = await start_web(settings_for(tmp_path, coalesce_seconds=1.0))
    try:
        turns = web.server.turns
        stale = turns.runtime_stale
        turns.runtime_stale = lambda: True  # 409 agent_runtime_stale, retryable
        sid = await web.new_session("refused")
        gate = threading.Event()
        ids = await asyncio.to_thread(_siblings, sid, [f"r{i}" for i in range(4)], gate)
        gate.set()
        # Every claim of the batch released with the refund: pending, no attempt spent.
        await _until(lambda: all(_row(i)["refunds"] == 1 for i in ids))
        for i in ids:
            row = _row(i)
            assert (row["delivery_state"], row["delivery_attempts"]) == ("pending", 0)
            assert row["claim_token"] is None
        assert _wake_messages(web, sid) == []

        # Once the runtime is current again the ledger offers them again: delivered once.
        turns.runtime_stale = stale
        await _until(lambda: _delivered(ids), timeout=30)
        assert [_row(i)["delivery_attempts"] for i in ids] == [1] * 4
        woken = [m["delegation_id"] for t in _wake_messages(web, sid) for m in read_wake_data(t)]
        assert sorted(woken) == sorted(ids)
    finally:
        await stop_web(web)
