"""MCP in a web UI session: a write tool's call shows an approval card (the web UI's
approval event), runs once approved, and a server's question is asked the same way."""

from __future__ import annotations

from tests.webui.conftest import _clean_process_state, settings_for, start_web, stop_web

from ._support import stdio_echo

__all__ = ["_clean_process_state"]  # the autouse fixture of the web UI tests


async def test_an_mcp_call_is_approved_in_the_web_ui(tmp_path) -> None:  # type: ignore[no-untyped-def]
    web = await start_web(settings_for(tmp_path, mcp_servers=(stdio_echo(),)))
    try:
        sse = await web.stream()
        sid = await web.new_session()
        await web.say(sid, 'call echo__note with {"text": "<b>web</b>"}')
        _, _, pending = await sse.wait_for(lambda e: e[1] == "approval", timeout=30)
        approval = pending["approval"]
        assert approval["command"] == 'MCP echo__note {"text": "<b>web</b>"}'
        r = await web.post(f"/api/approvals/{approval['id']}", {"decision": "approve"})
        assert r.status == 200, await r.text()
        end = await sse.wait_for(lambda e: e[1] == "turn.end", timeout=30)
        assert end[2]["status"] == "done" and "noted: <b>web</b>" in end[2]["content"]

        await web.say(sid, 'call echo__confirm with {"question": "ship it?"}')
        _, _, asked = await sse.wait_for(
            lambda e: e[1] == "approval" and e[2]["approval"]["id"] != approval["id"], timeout=30
        )
        assert asked["approval"]["command"] == "MCP server echo asks: ship it?"
        r = await web.post(f"/api/approvals/{asked['approval']['id']}", {"decision": "approve"})
        assert r.status == 200, await r.text()
        second = await sse.wait_for(lambda e: e[1] == "turn.end" and e[2] != end[2], timeout=30)
        assert "answer: accept go=True" in second[2]["content"]
        await sse.close()
    finally:
        await stop_web(web)
