"""A background shell process approved in the web UI comes home as a process card; a
wake-up turn that fails for a reason a retry cannot fix pauses wake-ups until the user writes."""

from __future__ import annotations

import asyncio
from typing import Any

from agent.markers import WAKE_MARKER
from agent.providers.base import ProviderError
from agent.providers.demo import DemoModel
from api import routes
from tests.webui.conftest import settings_for, start_web, stop_web


async def test_approved_background_command_comes_home_as_a_process_card(tmp_path) -> None:
    settings = settings_for(tmp_path, shell_enabled=True, shell_workdir=str(tmp_path))
    web = await start_web(settings)
    try:
        sse = await web.stream()
        sid = await web.new_session()
        await web.say(sid, "run in the background: echo '<b>hi</b>'; exit 3")
        _, _, approval = await sse.wait_for(lambda e: e[1] == "approval")
        await web.post(f"/api/approvals/{approval['approval']['id']}", {"decision": "approve"})
        _, _, wake = await sse.wait_for(lambda e: e[1] == "wakeup", timeout=20)
        card = wake["card"]
        assert card["work_kind"] == "process"
        assert card["command"] == "echo '<b>hi</b>'; exit 3"
        assert card["exit_code"] == 3
        assert "<b>hi</b>" in card["result"]
        await sse.wait_for(
            lambda e: (
                e[1] == "turn.end"
                and any(
                    s["wakeup"] and s["stream_id"] == e[2]["stream_id"]
                    for s in sse.of("turn.start")
                )
            )
        )
        items = (await web.session(sid))["items"]
        assert [i["kind"] for i in items].count("wakeup") == 1
        await sse.close()
    finally:
        await stop_web(web)


class FailsOnWake(DemoModel):
    """The demo model, except that a wake-up turn's provider call fails."""

    async def complete(self, messages: Any, **kw: Any) -> Any:
        last = messages[-1]
        if last.get("role") == "user" and str(last.get("content", "")).startswith(WAKE_MARKER):
            raise ProviderError("credentials exhausted")
        return await super().complete(messages, **kw)


async def test_failed_wakeup_pauses_wakeups_until_the_user_writes(tmp_path) -> None:
    web = await start_web(settings_for(tmp_path), provider=FailsOnWake(delay_seconds=0))
    try:
        sse = await web.stream()
        sid = await web.new_session()
        wake = f"{WAKE_MARKER} something finished"
        ok = await asyncio.to_thread(routes.start_session_turn, sid, wake, source="process_wakeup")
        assert "_status" not in ok
        end = await sse.wait_for(lambda e: e[1] == "turn.end")
        assert end[2]["status"] == "error"
        paused = await asyncio.to_thread(
            routes.start_session_turn, sid, wake, source="process_wakeup"
        )
        assert paused["_status"] == 409 and paused["error"] == "process_wakeup_paused"
        await web.say(sid, "hello")  # the user is back
        await sse.wait_for(lambda e: e[1] == "turn.end" and e[2]["status"] == "done")
        again = await asyncio.to_thread(
            routes.start_session_turn, sid, wake, source="process_wakeup"
        )
        assert "_status" not in again
        await sse.close()
    finally:
        await stop_web(web)
