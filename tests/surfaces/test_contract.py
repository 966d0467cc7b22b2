"""The surface contract: what every chat platform must do, run against each of them
(``conftest.PLATFORMS``; a platform joins with its ``FakePlatform``, see ``contract.py``).

Against `reveille serve` processes (SIGKILL, wake-ups, approvals, rate limits, a blocked bot)
and the in-process application (combined results, long replies, hostile formatting) with the
platform's stand-in on loopback:

* a message is answered once after a SIGKILL at each point: taken, answered, confirmed;
* a background result is delivered once as a wake-up, combined with its siblings, held
  behind a pending approval;
* an approval is decided by the conversation's owner only;
* a long reply is split within the platform's limit;
* formatting a model writes cannot break the platform's parser;
* a rate limit's Retry-After is honoured, on a reply and on a wake-up (which spends no
  attempt);
* a chat that blocked the bot is reported and its delivery dropped, the result kept;
* ``/timers`` lists the chat's pending reminders, answered by the bot itself (no turn).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import tools.async_delegation as ad
from agent.markers import WAKE_MARKER, read_wake_data
from agent.providers.demo import DemoModel
from delivery.rows import LedgerRow
from reveille.app import App, serve
from reveille.settings import Settings
from tests.api_server.serve_support import Server, call, ledger_rows, wait_until
from tests.sessions._support import make_session
from tests.surfaces.contract import Button, FakePlatform
from tools.process_registry import process_registry

ASK = {"REVEILLE_SHELL_APPROVALS": "always"}


def _serve(home: Path, platform: FakePlatform, **extra: str) -> Server:
    return Server(home, extra_env={**platform.env(), **extra})


def _user_turns(port: int, session_id: str) -> list[str]:
    status, _, data = call(port, "GET", f"/api/sessions/{session_id}/messages")
    assert status == 200, data
    return [m["content"] for m in data["data"] if m["role"] == "user"]


def _settled(home: Path) -> list[LedgerRow]:
    return [r for r in ledger_rows(home) if r.delivery_state != "pending"]


def _row(home: Path, text: str) -> LedgerRow | None:
    rows = [r for r in ledger_rows(home) if text in (r.goal or "")]
    return rows[0] if rows else None


def _next_button(platform: FakePlatform, seen: set[Any]) -> Button:
    found = wait_until(
        lambda: [b for b in platform.buttons() if b.message not in seen], timeout=30
    )[0]
    seen.add(found.message)
    return found


# --------------------------------------------------------------------------- answered once


@pytest.mark.parametrize("point", ["taken", "answered", "confirmed"])
def test_a_message_is_answered_once_after_a_sigkill(
    tmp_path: Path, platform: FakePlatform, point: str
) -> None:
    session_id = platform.session_id(platform.owner)
    if point == "taken":
        platform.hold_replies()  # the reply cannot reach the chat before the kill
    first = _serve(tmp_path, platform)
    platform.say("hello there")
    if point == "taken":
        wait_until(lambda: platform.held() >= 1)
        assert platform.taken()
    else:
        wait_until(lambda: any("hello there" in t for t in platform.replies()))
        if point == "confirmed":
            time.sleep(1.0)  # its records are written and the message confirmed
    first.stop(signal.SIGKILL)
    if point == "taken":
        platform.release_replies(lost=True)
        time.sleep(0.2)
        assert platform.replies() == []
        platform.release_replies(lost=False)

    second = _serve(tmp_path, platform)
    try:
        wait_until(lambda: any("hello there" in t for t in platform.replies()), timeout=30)
        time.sleep(1.0)
        assert len(platform.replies()) == 1, platform.replies()
        # One turn: a restart answers from the stored turn instead of running it again.
        assert _user_turns(second.port, session_id) == ["hello there"]
    finally:
        second.stop()
    third = _serve(tmp_path, platform)
    try:
        time.sleep(1.5)
        assert len(platform.replies()) == 1
    finally:
        third.stop()


# --------------------------------------------------------------------------- wake-ups


def test_a_background_result_comes_home_once_as_a_wake_up(
    tmp_path: Path, platform: FakePlatform
) -> None:
    server = _serve(tmp_path, platform)
    try:
        platform.say("in the background: count the moons of Mars")
        wait_until(lambda: _settled(tmp_path), timeout=30)
        time.sleep(1.0)  # nothing else arrives
        texts = platform.replies()
        assert len(texts) == 2, texts
        assert "moons of Mars" in texts[1]
        [row] = ledger_rows(tmp_path)
        assert (row.delivery_state, row.delivery_attempts) == ("delivered", 1)
    finally:
        server.stop()


class _RecordingModel(DemoModel):
    """The demo model, with every wake-up it answers recorded, and scripted replies for
    ``say:<name>`` messages (``scripts``)."""

    def __init__(self, scripts: dict[str, str] | None = None) -> None:
        super().__init__(delay_seconds=0.0)
        self.wakes: list[str] = []
        self.scripts = scripts or {}

    async def complete(self, messages: Any, **kwargs: Any) -> Any:
        last = str(messages[-1].get("content") or "") if messages else ""
        if last.startswith(WAKE_MARKER):
            self.wakes.append(last)
        script = (
            self.scripts.get(last.removeprefix("say:").strip()) if last.startswith("say:") else None
        )
        if script is not None:
            on_delta = kwargs.get("on_delta")
            if on_delta is not None:
                await on_delta(script)
            reply = await super().complete(messages, **{**kwargs, "on_delta": None})
            reply.content = script
            return reply
        return await super().complete(messages, **kwargs)


@pytest.fixture
def scripts() -> dict[str, str]:
    return {}


@pytest.fixture
async def app(
    tmp_path: Path,
    platform: FakePlatform,
    scripts: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[App, _RecordingModel]]:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    ad.reset_runtime()
    process_registry.completion_queue.drain()
    settings = Settings(
        home=tmp_path,
        port=0,
        webui_port=0,
        api_key="k",
        max_async_children=10,
        coalesce_seconds=2.0,
        **platform.settings(),
    )
    model = _RecordingModel(scripts)
    async with serve(settings, provider=model, shutdown_grace_seconds=0.5) as running:
        session_id = platform.session_id(platform.owner)
        make_session(running.store, session_id, source=platform.source(platform.owner))
        yield running, model
    ad.reset_runtime()
    process_registry.completion_queue.drain()


async def _until(check: Any, timeout: float = 20.0) -> Any:
    return await asyncio.to_thread(wait_until, check, timeout)


def _delivery(row_id: str) -> dict[str, Any]:
    row = ad.get_durable_delegation(row_id)
    assert row is not None
    return dict(row)


async def test_siblings_finishing_together_are_one_wake_up(
    app: tuple[App, _RecordingModel], platform: FakePlatform
) -> None:
    _running, model = app
    session_id = platform.session_id(platform.owner)
    gate = threading.Event()

    def dispatch() -> list[str]:
        ids = []
        for goal in ("survey north", "survey south", "survey east"):

            def run(goal: str = goal) -> dict[str, Any]:
                gate.wait(10)
                return {"status": "completed", "summary": f"{goal}: done"}

            res = ad.dispatch_async_delegation(
                goal=goal,
                runner=run,
                session_key=session_id,
                origin_session_id=session_id,
                max_async_children=3,
            )
            assert res["status"] == "dispatched", res
            ids.append(str(res["delegation_id"]))
        return ids

    ids = await asyncio.to_thread(dispatch)
    gate.set()
    await _until(lambda: all(_delivery(i)["delivery_state"] == "delivered" for i in ids))
    await _until(platform.replies)
    await asyncio.sleep(0.3)  # a second wake-up turn, had one started, would show by now
    [wake] = model.wakes
    found = [str(m.get("delegation_id")) for m in read_wake_data(wake)]
    assert sorted(found) == sorted(ids)
    assert [_delivery(i)["delivery_attempts"] for i in ids] == [1, 1, 1]
    assert len(platform.replies()) == 1  # one reply in the chat, not three


def test_a_wake_up_waits_behind_a_pending_approval(tmp_path: Path, platform: FakePlatform) -> None:
    server = _serve(tmp_path, platform, **ASK)
    try:
        seen: set[Any] = set()
        platform.say("run in the background: sleep 1; echo first-done")
        platform.press(_next_button(platform, seen), approve=True)
        wait_until(lambda: _row(tmp_path, "first-done"), timeout=30)
        # A second command asks while the first one runs: the session holds an approval.
        platform.say("run in the background: echo second")
        second = _next_button(platform, seen)

        def first_claimed() -> bool:
            row = _row(tmp_path, "first-done")
            return bool(row and row.completed_at and row.claim_consumer)

        wait_until(first_claimed, timeout=30)
        row = _row(tmp_path, "first-done")
        assert row is not None and row.delivery_state == "pending"
        platform.press(second, approve=True)
        wait_until(
            lambda: (r := _row(tmp_path, "first-done")) and r.delivery_state == "delivered",
            timeout=60,
        )
        row = _row(tmp_path, "first-done")
        assert row is not None and row.delivery_attempts == 1
    finally:
        server.stop()


# --------------------------------------------------------------------------- approvals


def test_only_the_owner_decides_an_approval(tmp_path: Path, platform: FakePlatform) -> None:
    server = _serve(tmp_path, platform, **ASK)
    try:
        platform.say("run in the background: echo owner-only")
        button = _next_button(platform, set())
        platform.press(button, approve=True, user=platform.other)
        wait_until(lambda: platform.press_answers())
        assert "not yours" in platform.press_answers()[0].lower()
        time.sleep(0.5)
        assert _row(tmp_path, "owner-only") is None  # nothing ran
        assert platform.buttons()  # still asked
        platform.press(button, approve=True)
        wait_until(lambda: len(platform.press_answers()) >= 2)
        assert platform.press_answers()[1].lower().startswith("approved")
        wait_until(lambda: _row(tmp_path, "owner-only"), timeout=30)
    finally:
        server.stop()


# --------------------------------------------------------------------------- sending


LONG = "\n\n".join(f"Paragraph {i}: " + "word " * 60 for i in range(40))
HOSTILE = (
    "Tags <b>bold</b> & <unclosed and a stray < or &amp; or &bogus;\n"
    "*half bold, **unbalanced, `code <i>` [link](javascript:alert(1)) __x__ ~~y\n"
    "```python\nfenced <i> & never closed\n"
)


@pytest.mark.parametrize("scripts", [{"long": LONG}])
async def test_a_long_reply_is_split_within_the_limit(
    app: tuple[App, _RecordingModel], platform: FakePlatform, scripts: dict[str, str]
) -> None:
    platform.say("say:long")
    await _until(lambda: any("Paragraph 39:" in t for t in platform.replies()))
    pieces = platform.replies()
    assert len(pieces) >= len(LONG) // platform.max_chars
    assert all(len(p) <= platform.max_chars for p in pieces)
    joined = "\n".join(pieces)
    at = [joined.find(f"Paragraph {i}:") for i in range(40)]
    assert all(a >= 0 for a in at) and at == sorted(at)  # every paragraph, in order
    assert all(joined.count(f"Paragraph {i}:") == 1 for i in range(40))


@pytest.mark.parametrize("scripts", [{"hostile": HOSTILE}])
async def test_formatting_cannot_break_the_platforms_parser(
    app: tuple[App, _RecordingModel], platform: FakePlatform, scripts: dict[str, str]
) -> None:
    platform.say("say:hostile")
    [reply] = await _until(platform.replies)
    await asyncio.sleep(0.3)
    [reply] = platform.replies()
    for literal in ("<unclosed", "stray <", "javascript", "fenced <i> & never closed"):
        assert literal in reply, reply


# --------------------------------------------------------------------------- refusals


def test_a_rate_limit_on_a_reply_is_waited_out(tmp_path: Path, platform: FakePlatform) -> None:
    server = _serve(tmp_path, platform)
    try:
        # The demo model's answer opens with "This is Reveille's built-in demo model".
        platform.rate_limit(retry_after=3, when_text="This")
        platform.say("hello, slowly")
        wait_until(lambda: any("hello, slowly" in t for t in platform.replies()), timeout=30)
        [refused_at] = platform.rate_limited_at()
        [sent_at] = platform.reply_times()
        assert sent_at - refused_at >= 3.0  # Retry-After was waited out
        time.sleep(0.5)
        assert len(platform.replies()) == 1
    finally:
        server.stop()


def test_a_rate_limited_wake_up_waits_and_spends_no_attempt(
    tmp_path: Path, platform: FakePlatform
) -> None:
    server = _serve(tmp_path, platform)
    try:
        # Longer than the ledger's first retry backoff (2 s): only honouring it passes.
        platform.rate_limit(retry_after=3, when_text="Background")
        platform.say("in the background: slow down")
        wait_until(lambda: _settled(tmp_path), timeout=30)
        texts = platform.replies()
        assert len(texts) == 2, texts
        assert "slow down" in texts[1]
        [row] = ledger_rows(tmp_path)
        assert (row.delivery_state, row.delivery_attempts) == ("delivered", 1)
        [refused_at] = platform.rate_limited_at()
        assert platform.reply_times()[1] - refused_at >= 3.0  # Retry-After was waited out
    finally:
        server.stop()


def test_a_chat_that_blocked_the_bot_is_reported_and_dropped(
    tmp_path: Path, platform: FakePlatform
) -> None:
    platform.block(platform.owner)
    server = _serve(tmp_path, platform)
    try:
        platform.say("in the background: unwanted")
        wait_until(lambda: _settled(tmp_path), timeout=30)
        [row] = ledger_rows(tmp_path)
        assert row.delivery_state == "dropped"
        assert row.state == "completed"  # the result is kept
        assert (row.settled_reason or "").lower().startswith(platform.name)
        assert platform.replies() == []
    finally:
        server.stop()


# --------------------------------------------------------------------------- /timers


def test_timers_lists_the_chats_reminders_without_a_turn(
    tmp_path: Path, platform: FakePlatform
) -> None:
    server = _serve(tmp_path, platform)
    try:
        platform.say("/timers")
        wait_until(lambda: any("Nothing is scheduled" in t for t in platform.replies()), 30)
        platform.say("remind me in 600 seconds: water the plants")
        wait_until(lambda: any("Reminder set for" in t for t in platform.replies()), 30)
        platform.say("/timers")
        wait_until(lambda: any("Scheduled here:" in t for t in platform.replies()), 30)
        [listing] = [t for t in platform.replies() if "Scheduled here:" in t]
        assert "water the plants — once" in listing and "tmr_" in listing
        turns = _user_turns(server.port, platform.session_id(platform.owner))
        assert not any("/timers" in t for t in turns), turns
    finally:
        server.stop()
