"""The event stream: increasing ids, Last-Event-ID replay, reset, reload mid-turn, stop."""

from __future__ import annotations

import asyncio
import contextlib
import os

from tests.webui.conftest import SlowDemo, Web, settings_for, start_web, stop_web


async def test_last_event_id_replays_what_was_missed(web: Web) -> None:
    first = await web.stream()
    sid = await web.new_session()
    await web.say(sid, "hello")
    await first.wait_for(lambda e: e[1] == "turn.end")
    seen = [e for e in first.events if e[0]]
    await first.close()
    middle = seen[len(seen) // 2]
    again = await web.stream(last_event_id=middle[0])
    await again.wait_for(lambda e: e[1] == "turn.end")
    assert [e[0] for e in again.events] == [e[0] for e in seen if int(e[0]) > int(middle[0])]
    await again.close()


async def test_unknown_or_pruned_id_gets_reset(web: Web) -> None:
    sse = await web.stream(last_event_id="999999")
    _, kind, _ = await sse.wait_for(lambda e: True)
    assert kind == "reset"
    await sse.close()
    sse = await web.stream(last_event_id="not-a-number")
    _, kind, _ = await sse.wait_for(lambda e: True)
    assert kind == "reset"
    await sse.close()


async def test_pruned_log_resets(tmp_path) -> None:
    web = await start_web(settings_for(tmp_path))
    try:
        web.server.log.keep = 5
        sid = await web.new_session()
        for i in range(600):
            await web.server.log.append("session", {"n": i, "session_id": sid})
        sse = await web.stream(last_event_id="1")
        _, kind, _ = await sse.wait_for(lambda e: True)
        assert kind == "reset"
        await sse.close()
    finally:
        await stop_web(web)


async def test_reload_mid_turn_shows_the_reply_once(tmp_path) -> None:
    web = await start_web(settings_for(tmp_path), provider=SlowDemo(step=0.03))
    try:
        sid = await web.new_session()
        sse = await web.stream()
        await web.say(sid, "tell me something long")
        await sse.wait_for(lambda e: e[1] == "turn.delta")
        await asyncio.sleep(0.1)
        body = await web.session(sid)  # the reload
        active = body["active_stream"]
        assert active is not None and active["text"]
        resumed = await web.stream(last_event_id=active["last_event_id"])
        end = await resumed.wait_for(lambda e: e[1] == "turn.end", timeout=20)
        shown = active["text"] + "".join(
            d["text"] for d in resumed.of("turn.delta") if d["stream_id"] == active["stream_id"]
        )
        assert shown == end[2]["content"]
        await sse.close()
        await resumed.close()
    finally:
        await stop_web(web)


async def test_stop_cancels_the_turn_and_keeps_what_was_shown(tmp_path) -> None:
    web = await start_web(settings_for(tmp_path), provider=SlowDemo(step=0.05))
    try:
        sid = await web.new_session()
        sse = await web.stream()
        await web.say(sid, "hello, say a lot")
        await sse.wait_for(lambda e: e[1] == "turn.delta")
        r = await web.post(f"/api/sessions/{sid}/stop")
        assert (await r.json()) == {"stopped": True}
        end = await sse.wait_for(lambda e: e[1] == "turn.end")
        assert end[2]["status"] == "stopped"
        shown = "".join(d["text"] for d in sse.of("turn.delta"))
        assert end[2]["content"] == shown
        count = len(sse.of("turn.delta"))
        await asyncio.sleep(0.3)
        assert len(sse.of("turn.delta")) == count  # really stopped
        items = (await web.session(sid))["items"]
        assert items[-1]["content"] == shown and items[-1]["stopped"] is True
        again = await web.post(f"/api/sessions/{sid}/stop")
        assert (await again.json()) == {"stopped": False}
        # the session is free again
        await web.say(sid, "hello again")
        await sse.close()
    finally:
        await stop_web(web)


async def test_second_message_while_streaming_is_409(tmp_path) -> None:
    model = SlowDemo(step=0.01)
    model.gate = asyncio.Event()
    web = await start_web(settings_for(tmp_path), provider=model)
    try:
        sid = await web.new_session()
        started = await web.say(sid, "one")
        r = await web.post(f"/api/sessions/{sid}/messages", {"text": "two"})
        assert r.status == 409
        body = await r.json()
        assert body["error"]["active_stream_id"] == started["stream_id"]
        model.gate.set()
    finally:
        await stop_web(web)


async def test_event_streams_are_bounded_per_owner_and_in_total(web: Web) -> None:
    # Each open stream holds a connection: one client must not be able to open them without
    # bound. An owner (here: the loopback address, no password) that opens too many has its
    # oldest stream ended; with every stream of the server open, a new one gets 429.
    web.server.log.max_streams_per_owner = 2
    first = await web.stream()
    second = await web.stream()
    third = await web.stream()
    assert first.task is not None
    await asyncio.wait_for(first.task, 5)  # the oldest one ended (its tab reconnects)
    assert second.task is not None and not second.task.done()
    web.server.log.max_streams_per_owner = 32
    web.server.log.max_streams = 2
    r = await web.get("/api/events")
    assert r.status == 429 and r.headers["Retry-After"].isdigit()
    assert (await r.json())["error"]["code"] == "too_many_streams"
    for sse in (second, third):
        await sse.close()


async def test_a_long_replay_is_read_a_page_at_a_time(web: Web) -> None:
    """A tab reconnecting behind a long log was sent up to 5,000 events read into one list
    first (78.8 MB per tab, and the memory stayed with the process). Now the replay reads
    the log a page at a time, each page written before the next is read, and sends every
    missed event in order all the same."""
    from api.event_stream import REPLAY_PAGE

    log = web.server.log
    first = await log.append("note", {"n": -1, "pad": "x"})
    for n in range(3 * REPLAY_PAGE + 7):
        await log.append("note", {"n": n, "pad": "x" * 2000})
    asked: list[int] = []
    backend = log.backend
    real = backend.events_after

    def events_after(after_id: int, limit: int):  # type: ignore[no-untyped-def]
        asked.append(limit)
        return real(after_id, limit)

    backend.events_after = events_after  # type: ignore[method-assign]
    try:
        sse = await web.stream(last_event_id=str(first.id))
        await sse.wait_for(lambda e: e[1] == "note" and e[2]["n"] == 3 * REPLAY_PAGE + 6)
        assert [d["n"] for d in sse.of("note")] == list(range(3 * REPLAY_PAGE + 7))
        await sse.close()
    finally:
        backend.events_after = real  # type: ignore[method-assign]
    assert asked and max(asked) <= REPLAY_PAGE + 1, asked


async def test_a_replay_beyond_the_bound_is_a_reset(web: Web) -> None:
    from api.event_stream import MAX_REPLAY

    log = web.server.log
    first = await log.append("note", {"n": -1})
    for n in range(MAX_REPLAY + 1):
        await log.append("note", {"n": n})
    sse = await web.stream(last_event_id=str(first.id))
    _, kind, _ = await sse.wait_for(lambda e: True)
    assert kind == "reset"
    await sse.close()


async def test_a_deleted_webui_db_is_made_again_and_the_tabs_follow_it(web: Web) -> None:
    """Its ids start again: a tab open through it is ended (it reconnects and is reset),
    and a tab opened after it sees the new events live."""
    path = web.server.log.backend.spec.path  # type: ignore[attr-defined]
    await web.new_session("before")
    for n in range(20):
        await web.server.log.append("note", {"n": n})
    old = await web.stream()
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}{suffix}")
    sid = await web.new_session("after")  # written to the file made again
    assert os.path.exists(path)
    await old.close()
    tab = await web.stream()
    await web.say(sid, "hello")
    await tab.wait_for(lambda e: e[1] == "turn.end")
    await tab.close()
