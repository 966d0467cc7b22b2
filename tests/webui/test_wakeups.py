"""Background work started in a web UI session comes home as a wake-up turn, exactly once."""

from __future__ import annotations

import asyncio
from typing import Any

import tools.async_delegation as ad
from agent.markers import WAKE_MARKER
from agent.providers.demo import DemoModel
from tests.webui.conftest import Web, settings_for, start_web, stop_web


async def _wakeup_done(web: Web, sse, sid: str) -> None:
    await sse.wait_for(lambda e: e[1] == "wakeup" and e[2]["session_id"] == sid)
    await sse.wait_for(
        lambda e: (
            e[1] == "turn.end"
            and e[2]["session_id"] == sid
            and any(
                s["stream_id"] == e[2]["stream_id"] and s["wakeup"] for s in sse.of("turn.start")
            )
        )
    )


async def test_delegation_result_arrives_as_card_and_reply_once(web: Web) -> None:
    sse = await web.stream()
    sid = await web.new_session("work")
    await web.say(sid, "in the background: count the stars")
    await _wakeup_done(web, sse, sid)
    await asyncio.sleep(0.3)  # anything duplicated would show by now
    cards = sse.of("wakeup")
    assert len(cards) == 1
    card = cards[0]["card"]
    assert card["goal"] == "count the stars" and card["status"] == "completed"
    assert card["work_kind"] == "delegation" and card["delivery_id"].startswith("deleg_")
    toasts = sse.of("toast")
    assert [t["goal"] for t in toasts] == ["count the stars"]
    assert any(s["session"]["id"] == sid and s["session"]["unread"] for s in sse.of("session"))
    body = await web.session(sid)
    kinds = [(i["kind"], i.get("role"), i.get("wakeup")) for i in body["items"]]
    assert kinds == [
        ("message", "user", False),
        ("tool", None, None),
        ("message", "assistant", False),
        ("wakeup", None, None),
        ("message", "assistant", True),
    ]
    tool = body["items"][1]
    assert (tool["name"], tool["status"]) == ("delegate_task", "done")
    steps = [(t["name"], t["status"]) for t in sse.of("turn.tool")]
    assert steps == [("delegate_task", "started"), ("delegate_task", "done")]
    assert body["session"]["unread"] is True
    r = await web.post(f"/api/sessions/{sid}/read")
    assert r.status == 204
    assert (await web.session(sid))["session"]["unread"] is False
    row = ad.get_durable_delegation(card["delivery_id"])
    assert row is not None and row["delivery_state"] == "delivered"
    assert row["delivery_attempts"] == 1
    deliveries = (await (await web.get("/api/deliveries?state=delivered")).json())["deliveries"]
    assert [d["id"] for d in deliveries] == [card["delivery_id"]]
    assert any(d["delivery"]["id"] == card["delivery_id"] for d in sse.of("delivery"))
    await sse.close()


async def test_wakeup_runs_with_no_tab_open(tmp_path) -> None:
    web = await start_web(settings_for(tmp_path))
    try:
        sid = await web.new_session()
        await web.say(sid, "in the background: water the plants")
        for _ in range(200):
            items = (await web.session(sid))["items"]
            if any(i.get("wakeup") for i in items):
                break
            await asyncio.sleep(0.05)
        items = (await web.session(sid))["items"]
        assert [i["kind"] for i in items].count("wakeup") == 1
        assert items[-1]["wakeup"] is True and items[-1]["content"]
        # A tab opened afterwards replays the card from the log.
        sse = await web.stream(last_event_id="0")
        await sse.wait_for(lambda e: e[1] == "wakeup")
        await sse.close()
    finally:
        await stop_web(web)


async def test_unread_mark_and_event_log_survive_a_restart(tmp_path) -> None:
    import os
    import stat

    settings = settings_for(tmp_path)
    web = await start_web(settings)
    sid = await web.new_session()
    await web.say(sid, "in the background: sort the mail")
    for _ in range(200):
        if (await web.session(sid))["session"]["unread"]:
            break
        await asyncio.sleep(0.05)
    last = (await web.session(sid))["last_event_id"]
    await stop_web(web)
    db = settings.home / "webui.db"
    assert stat.S_IMODE(os.stat(db).st_mode) == 0o600
    web = await start_web(settings)
    try:
        assert (await web.session(sid))["session"]["unread"] is True
        sse = await web.stream(last_event_id="0")
        await sse.wait_for(lambda e: e[0] == last)
        assert not any(e[1] == "reset" for e in sse.events)
        await sse.close()
    finally:
        await stop_web(web)


async def test_unfinished_work_is_listed_until_it_comes_home(tmp_path) -> None:
    web = await start_web(settings_for(tmp_path), provider=DemoModel(delay_seconds=1.0))
    try:
        sse = await web.stream()
        sid = await web.new_session()
        other = await web.new_session()
        stream_id = (await web.say(sid, "in the background: <b>chart</b> the stars"))["stream_id"]
        await sse.wait_for(lambda e: e[1] == "turn.end" and e[2].get("stream_id") == stream_id)
        work = (await web.session(sid))["background"]
        assert [(w["kind"], w["state"], w["goal"]) for w in work] == [
            ("delegation", "running", "<b>chart</b> the stars")
        ]
        assert work[0]["id"].startswith("deleg_") and work[0]["started_at"]

        async def background(session_id: str) -> tuple[int, Any]:
            r = await web.get(f"/api/sessions/{session_id}/background")
            return r.status, await r.json()

        assert await background(other) == (200, {"background": []})  # never another's work
        await _wakeup_done(web, sse, sid)
        assert await background(sid) == (200, {"background": []})
        status, body = await background("sess_unknown")
        assert status == 404 and body["error"]["code"] == "session_not_found"
        status, _ = await background("bad id!")
        assert status in (400, 404)
        await sse.close()
    finally:
        await stop_web(web)


class HoldsWake(DemoModel):
    """The demo model, except that a wake-up turn's answer waits for ``release``."""

    def __init__(self) -> None:
        super().__init__(delay_seconds=0.0)
        self.release = asyncio.Event()

    async def complete(self, messages: Any, **kw: Any) -> Any:
        last = messages[-1]
        if last.get("role") == "user" and str(last.get("content", "")).startswith(WAKE_MARKER):
            await self.release.wait()
        return await super().complete(messages, **kw)


async def test_a_wakeup_is_acknowledged_only_once_its_turn_is_stored(tmp_path) -> None:
    # Acknowledged when the turn merely started, a wake-up whose server dies mid-turn would
    # be "delivered" with nothing in the transcript. The row stays pending (claimed) while
    # the wake-up turn runs, and is delivered once the turn is stored.
    model = HoldsWake()
    web = await start_web(settings_for(tmp_path), provider=model)
    try:
        sse = await web.stream()
        sid = await web.new_session("work")
        await web.say(sid, "in the background: weigh the moon")
        card = (await sse.wait_for(lambda e: e[1] == "wakeup"))[2]["card"]
        row = ad.get_durable_delegation(card["delivery_id"])
        assert row is not None and row["delivery_state"] == "pending"
        assert row["delivery_attempts"] == 1  # claimed: nobody else runs it meanwhile
        model.release.set()
        await _wakeup_done(web, sse, sid)
        for _ in range(200):
            row = ad.get_durable_delegation(card["delivery_id"])
            if row is not None and row["delivery_state"] == "delivered":
                break
            await asyncio.sleep(0.02)
        assert row is not None and row["delivery_state"] == "delivered"
        await sse.close()
    finally:
        model.release.set()
        await stop_web(web)


async def test_a_wakeup_turn_that_stores_nothing_is_offered_again_not_delivered(
    tmp_path,
) -> None:
    from tests.webui.test_process_and_pause import FailsOnWake

    web = await start_web(settings_for(tmp_path), provider=FailsOnWake(delay_seconds=0))
    try:
        sse = await web.stream()
        sid = await web.new_session("work")
        await web.say(sid, "in the background: weigh the sun")
        card = (await sse.wait_for(lambda e: e[1] == "wakeup"))[2]["card"]
        end = await sse.wait_for(
            lambda e: e[1] == "turn.end" and e[2]["status"] == "error", timeout=10
        )
        assert end[2]["session_id"] == sid
        for _ in range(200):
            row = ad.get_durable_delegation(card["delivery_id"])
            if row is not None and row["delivery_attempts"] == 0:
                break
            await asyncio.sleep(0.02)
        # Released with its attempt refunded: pending, to be offered again once the user is
        # back (the session's wake-ups pause after a failed one), never marked delivered.
        assert row is not None and row["delivery_state"] == "pending"
        assert row["delivery_attempts"] == 0
        await sse.close()
    finally:
        await stop_web(web)


async def test_a_wakeup_for_a_deleted_session_is_dropped_at_once_with_the_reason(
    web: Web,
) -> None:
    # The session is gone for good: retrying as an ordinary release would spend the whole
    # budget over minutes and call it "budget spent".
    sid = await web.new_session("soon gone")
    assert web.app.store.delete_session(sid)
    res = await asyncio.to_thread(
        ad.dispatch_async_delegation,
        goal="count the grains",
        runner=lambda: {"status": "completed", "summary": "many"},
        origin_ui_session_id=sid,
    )
    for _ in range(200):
        row = ad.get_durable_delegation(res["delegation_id"])
        if row is not None and row["delivery_state"] != "pending":
            break
        await asyncio.sleep(0.02)
    assert row is not None and row["delivery_state"] == "dropped"
    assert "deleted" in row["settled_reason"] and row["delivery_attempts"] == 1
    assert row["event"]["summary"] == "many"  # the result stays queryable
