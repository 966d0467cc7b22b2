"""A reminder set in a web UI session ("remind me in 2 seconds: ...") comes home as a
scheduled wake-up card and a wake-up turn that restates its text, exactly once."""

from __future__ import annotations

import asyncio

import tools.async_delegation as ad
from tests.webui.conftest import settings_for, start_web, stop_web


async def test_a_reminder_comes_home_as_one_card_and_one_turn(tmp_path) -> None:
    web = await start_web(settings_for(tmp_path, timers_min_delay_seconds=1.0))
    try:
        sse = await web.stream()
        sid = await web.new_session("reminders")
        await web.say(sid, "remind me in 2 seconds: stretch your legs")
        await sse.wait_for(lambda e: e[1] == "wakeup" and e[2]["session_id"] == sid)
        await sse.wait_for(
            lambda e: (
                e[1] == "turn.end"
                and e[2]["session_id"] == sid
                and any(
                    s["stream_id"] == e[2]["stream_id"] and s["wakeup"]
                    for s in sse.of("turn.start")
                )
            )
        )
        await asyncio.sleep(0.3)  # anything duplicated would show by now
        [card] = [c["card"] for c in sse.of("wakeup")]
        assert card["work_kind"] == "scheduled_wakeup" and card["goal"] == "stretch your legs"
        assert card["delivery_id"].startswith("tmr_")
        items = (await web.session(sid))["items"]
        assert [i["kind"] for i in items].count("wakeup") == 1
        assert items[-1]["wakeup"] is True
        assert "Reminder: stretch your legs" in items[-1]["content"]
        row = ad.get_durable_delegation(card["delivery_id"])
        assert row is not None and row["delivery_state"] == "delivered"
        assert row["delivery_attempts"] == 1
        await sse.close()
    finally:
        await stop_web(web)
