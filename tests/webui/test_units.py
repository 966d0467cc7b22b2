"""The web UI's small parts on their own: cookie signing, CSRF, rate limit, the event log."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from api.approvals import AlreadyDecided, ApprovalRecord, Approvals
from api.auth import Auth
from api.event_log import EventLog
from api.views import card_from_metadata, title_from_text, transcript_items
from delivery.session_backend import MessageRecord
from gateway.session import SessionStore
from storage.sqlite.webui import WebUIStateError
from tests.stores import memory_sessions, webui_state


def test_cookies_are_signed_and_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = Auth("pw", b"s" * 32)
    cookie = auth.new_cookie()
    assert auth.logged_in(cookie)
    issued, epoch, nonce, sig = cookie.split(".")
    assert not auth.logged_in(f"{issued}.{epoch}.{nonce}.{'0' * len(sig)}")
    assert not auth.logged_in(f"{int(issued) + 1}.{epoch}.{nonce}.{sig}")
    assert not auth.logged_in(f"{issued}.{int(epoch) + 1}.{nonce}.{sig}")
    assert not Auth("pw", b"t" * 32).logged_in(cookie)
    assert not auth.logged_in(None) and not auth.logged_in("garbage")
    assert not auth.needs_renewal(cookie)
    monkeypatch.setattr(time, "time", lambda: int(issued) + 2 * 24 * 3600)
    assert auth.logged_in(cookie) and auth.needs_renewal(cookie)  # in use: renewed
    monkeypatch.setattr(time, "time", lambda: int(issued) + 8 * 24 * 3600)
    assert not auth.logged_in(cookie)  # idle for a week: gone


def test_a_clock_step_logs_nobody_out() -> None:
    """Stepping the wall clock back (NTP, a resumed VM) made every cookie "from the future"
    and logged everyone out; stepping it forward by less than a cookie's life must not."""
    from api.auth import COOKIE_MAX_AGE_SECONDS

    wall = [1_700_000_000.0]
    auth = Auth("pw", b"s" * 32, wall_clock=lambda: wall[0])
    cookie = auth.new_cookie()
    assert int(cookie.split(".")[0]) == 1_700_000_000  # stamped by the injected clock
    wall[0] -= 3600.0  # stepped back an hour
    assert auth.logged_in(cookie) and auth.login_id(cookie)
    assert auth.csrf_token(cookie) != auth.csrf_token(None)
    assert auth.needs_renewal(cookie)  # re-issued in the clock's new time base
    renewed = auth.new_cookie()
    assert auth.logged_in(renewed) and not auth.needs_renewal(renewed)
    wall[0] -= 2 * COOKIE_MAX_AGE_SECONDS  # beyond reason: not a login
    assert not auth.logged_in(cookie)
    wall[0] = 1_700_000_000.0 + COOKIE_MAX_AGE_SECONDS - 60  # forward, less than its life
    assert auth.logged_in(cookie) and auth.needs_renewal(cookie)
    wall[0] = 1_700_000_000.0 + COOKIE_MAX_AGE_SECONDS + 60
    assert not auth.logged_in(cookie)


def test_a_new_password_or_a_logout_ends_every_login() -> None:
    auth = Auth("pw", b"s" * 32)
    cookie = auth.new_cookie()
    assert not Auth("new password", b"s" * 32).logged_in(cookie)
    assert Auth("pw", b"s" * 32).logged_in(cookie)  # a restart keeps it
    auth.epoch += 1  # a logout
    assert not auth.logged_in(cookie)
    assert not Auth("pw", b"s" * 32, epoch=1).logged_in(cookie)  # also after a restart
    assert auth.logged_in(auth.new_cookie())


def test_csrf_token_is_bound_to_the_login() -> None:
    auth = Auth("pw", b"s" * 32)
    a, b = auth.new_cookie(), auth.new_cookie()
    assert auth.csrf_ok(auth.csrf_token(a), a)
    assert not auth.csrf_ok(auth.csrf_token(a), b)
    assert not auth.csrf_ok(None, a) and not auth.csrf_ok("", a)
    open_ui = Auth("", b"s" * 32)
    assert open_ui.logged_in(None) and open_ui.csrf_ok(open_ui.csrf_token(None), None)


def test_login_rate_limit_is_per_client_and_forgets() -> None:
    now = [0.0]
    auth = Auth("pw", b"s" * 32, max_failures=3, window_seconds=10, clock=lambda: now[0])
    # Attempts count as they start, whatever their answer turns out to be.
    assert all(auth.start_attempt("a") for _ in range(3))
    assert not auth.start_attempt("a") and auth.start_attempt("b")
    assert auth.rate_limited("a") and not auth.rate_limited("b")
    now[0] = 11
    assert not auth.rate_limited("a")
    assert auth.start_attempt("a") and auth.check_password("a", "pw")
    assert not auth.rate_limited("a")  # the right password forgives the attempts
    assert not auth.check_password("a", ["pw"])


async def test_event_log_replays_and_refuses_what_it_cannot(tmp_path) -> None:
    log = EventLog(webui_state("sqlite", tmp_path), keep=3)
    await log.aopen()
    try:
        ids = [(await log.append("x", {"n": i})).id for i in range(5)]
        replay = await log.since(ids[1])
        assert replay is not None and [e.data["n"] for e in replay] == [2, 3, 4]
        assert await log.since(ids[-1]) == []
        assert await log.since(ids[-1] + 1) is None
        assert await log.since(-5) is None
        sub = log.subscribe()
        event = await log.append("y", {"text": "<script>"})
        assert sub.queue.get_nowait() == event
        assert b'"text":"<script>"' in event.sse()
        log.end_streams()
        assert sub.queue.get_nowait() is None
        await log.set_unread("s1", True)
        assert await log.unread_ids() == {"s1"}
        assert await log.secret() == await log.secret()
    finally:
        log.close()


def test_event_log_refuses_another_programs_file(tmp_path) -> None:
    import sqlite3

    path = tmp_path / "webui.db"
    other = sqlite3.connect(path)
    other.execute("PRAGMA application_id = 12345")
    other.execute("CREATE TABLE t (x)")
    other.commit()
    other.close()
    with pytest.raises(WebUIStateError):
        webui_state("sqlite", tmp_path)


def test_views_keep_markup_as_text() -> None:
    card = card_from_metadata(
        {"kind": "process", "command": "<img src=x>", "exit_code": 1, "output_tail": "<b>"}
    )
    assert (card.work_kind, card.goal, card.exit_code, card.result) == (
        "process",
        "<img src=x>",
        1,
        "<b>",
    )
    items = transcript_items(
        [
            MessageRecord(1, "user", "<script>", 0.0, None, None, False),
            MessageRecord(2, "assistant", "ok", 0.0, None, None, False),
        ]
    )
    assert items[0]["content"] == "<script>" and items[1]["wakeup"] is False


async def test_a_stop_while_the_approval_is_announced_denies_it(tmp_path: Any) -> None:
    """The turn is cancelled while the pending approval is still being announced (the
    listener is slow): the approval ends denied and the session is free again."""
    announced = asyncio.Event()
    seen: list[str] = []

    async def slow_listener(approval: ApprovalRecord) -> None:
        seen.append(approval.status)
        announced.set()
        await asyncio.sleep(0.05)

    store = SessionStore(memory_sessions())
    store.take_turn("s1", "st_1")
    approvals = Approvals(store)
    approvals.listen(slow_listener)
    ask = asyncio.create_task(approvals.confirm_for("s1")("rm -rf /"))
    await announced.wait()
    ask.cancel()
    with pytest.raises(asyncio.CancelledError):
        await ask
    await asyncio.sleep(0.1)
    assert await approvals.pending_for("s1") is None
    assert seen == ["pending", "denied"]


async def test_an_approval_decided_by_another_server_reaches_the_asking_turn() -> None:
    """Two ``Approvals`` over one store stand for two servers: the turn asks on one, the
    tab decides on the other, and the asking turn learns it from the store."""
    store = SessionStore(memory_sessions())
    store.take_turn("s1", "st_1")
    asking, deciding = Approvals(store, poll_seconds=0.02), Approvals(store)
    ask = asyncio.create_task(asking.confirm_for("s1")("make deploy"))
    while (pending := await deciding.pending_for("s1")) is None:
        await asyncio.sleep(0.01)
    decided = await deciding.decide(pending.id, True)
    assert decided.status == "approved"
    assert await asyncio.wait_for(ask, 5) is True
    with pytest.raises(AlreadyDecided):
        await asking.decide(pending.id, False)


def test_a_title_from_the_first_message() -> None:
    assert title_from_text("  \n hello   world \nmore") == "hello world"
    assert title_from_text(" \n\t") is None
    long = "word " * 30
    title = title_from_text(long)
    assert title is not None and title.endswith("\u2026") and len(title) <= 60
    assert not title[:-1].endswith(" ")
    assert title_from_text("x" * 100) == "x" * 59 + "\u2026"


def test_the_per_process_maps_stay_bounded() -> None:
    from api import config as cfg

    try:
        for n in range(cfg.MAX_ENTRIES + 100):
            cfg.remember(f"deleg_{n}", float(n))
            cfg.index_session(f"proc_{n}", "s")
        for n in range(cfg.MAX_CARDS + 10):
            cfg.add_card("s", {"n": n})
        assert len(cfg.BG_TASK_COMPLETE_EVENTS_SEEN) == cfg.MAX_ENTRIES
        assert "deleg_0" not in cfg.BG_TASK_COMPLETE_EVENTS_SEEN  # the oldest went first
        assert len(cfg.PROCESS_SESSION_INDEX) == cfg.MAX_ENTRIES
        cards = cfg.PENDING_BG_TASK_COMPLETIONS["s"]
        assert len(cards) == cfg.MAX_CARDS and cards[-1] == {"n": cfg.MAX_CARDS + 9}
    finally:
        with cfg.MAPS_LOCK:
            cfg.BG_TASK_COMPLETE_EVENTS_SEEN.clear()
            cfg.PROCESS_SESSION_INDEX.clear()
            cfg.PENDING_BG_TASK_COMPLETIONS.clear()
