"""A watch in a web UI session comes home as one scheduled wake-up card and one wake-up
turn restating its note, like a reminder (the watch set through the tool's handler, in the
serving process, as the agent would)."""

from __future__ import annotations

import asyncio

from agent.tools import ToolContext
from tests.webui.conftest import settings_for, start_web, stop_web
from tools.watch_tool import make_watch_tool


async def test_a_fired_watch_comes_home_as_one_card_and_one_turn(tmp_path) -> None:
    web = await start_web(settings_for(tmp_path, shell_enabled=True))
    try:
        sse = await web.stream()
        sid = await web.new_session("watches")
        tool = make_watch_tool(shell_enabled=True)
        ctx = ToolContext(origin_ui_session_id=sid, session_key=f"webui:{sid}")
        args = {"note": "the flag is up: say so", "command": "echo flag is up", "max_fires": 1}
        created = await tool.handler(args, ctx)
        assert created["status"] == "watching", created
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
        assert card["work_kind"] == "scheduled_wakeup"
        assert card["goal"] == "the flag is up: say so"
        assert card["delivery_id"] == f"{created['watch_id']}.1"
        items = (await web.session(sid))["items"]
        assert [i["kind"] for i in items].count("wakeup") == 1
        assert items[-1]["wakeup"] is True
        assert "the flag is up: say so" in items[-1]["content"]  # the demo model restates it
        await sse.close()
    finally:
        await stop_web(web)
