"""Chatting in a web UI session over real HTTP: the reply streams as events with ids."""

from __future__ import annotations

from tests.webui.conftest import Web


async def test_chat_reply_streams_and_is_stored(web: Web) -> None:
    sse = await web.stream()
    sid = await web.new_session("first")
    started = await web.say(sid, "hello there")
    assert set(started) == {"stream_id", "session_id", "turn_id"}
    end = await sse.wait_for(lambda e: e[1] == "turn.end")
    deltas = "".join(d["text"] for d in sse.of("turn.delta"))
    assert end[2]["status"] == "done" and end[2]["content"] == deltas and deltas
    ids = [int(e[0]) for e in sse.events if e[0]]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    body = await web.session(sid)
    roles = [(i["kind"], i.get("role")) for i in body["items"]]
    assert roles == [("message", "user"), ("message", "assistant")]
    assert body["items"][1]["content"] == deltas
    assert body["active_stream"] is None
    sessions = (await (await web.get("/api/sessions")).json())["sessions"]
    assert [s["source"] for s in sessions if s["id"] == sid] == ["webui"]
    await sse.close()
