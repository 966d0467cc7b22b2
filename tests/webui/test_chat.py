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


async def test_an_untitled_session_is_named_after_its_first_message(web: Web) -> None:
    sse = await web.stream()

    async def say_and_wait(sid: str, text: str) -> None:
        stream_id = (await web.say(sid, text))["stream_id"]
        await sse.wait_for(lambda e: e[1] == "turn.end" and e[2].get("stream_id") == stream_id)

    async def title(sid: str) -> str:
        return str((await web.session(sid))["session"]["title"])

    sid = await web.new_session(None)
    assert await title(sid) == "New chat"
    await say_and_wait(sid, "\n  Plan the <b>release</b>   of version 2\nwith details")
    expected = "Plan the <b>release</b> of version 2"
    await sse.wait_for(lambda e: e[1] == "session" and e[2]["session"]["title"] == expected)
    await say_and_wait(sid, "a second message renames nothing")
    assert await title(sid) == expected
    chosen = await web.new_session("chosen")
    await say_and_wait(chosen, "my first words")
    assert await title(chosen) == "chosen"
    await sse.close()
