"""A lone result comes home without waiting out the coalescing window (issue 28 item 3): the
window is there for siblings that may still join the batch, so with nothing else of the
session running the result is delivered at once. The window is an hour here: were it
waited, the test would time out instead of passing."""

from __future__ import annotations

import tools.async_delegation as ad
from tests.webui.conftest import settings_for, start_web, stop_web
from tests.webui.test_combined_wakeups import _until


async def test_a_lone_result_is_delivered_without_the_window(tmp_path) -> None:
    web = await start_web(settings_for(tmp_path, coalesce_seconds=3600.0))
    try:
        sid = await web.new_session("one task")
        res = ad.dispatch_async_delegation(
            goal="the only one",
            runner=lambda: {"status": "completed", "summary": "alone and quick"},
            session_key=f"agent:main:webui:dm:{sid}",
            origin_session_id=sid,
            origin_ui_session_id=sid,
        )
        assert res["status"] == "dispatched", res

        def delivered() -> bool:
            row = ad.get_durable_delegation(str(res["delegation_id"]))
            return row is not None and row["delivery_state"] == "delivered"

        await _until(delivered)
        wakes = [m for m in web.app.store.messages(sid) if (m.display_metadata or {}).get("wake")]
        assert len(wakes) == 1 and "alone and quick" in wakes[0].content
    finally:
        await stop_web(web)
