"""A reminder set in a web UI session comes home as exactly one card and one wake-up reply,
even when the `reveille serve` that set it is SIGKILLed a second later, before it is due,
and a new server starts on the same state directory (the demo model, real processes)."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path

from tests.api_server.serve_support import Server, ledger_rows, wait_until
from tests.ports import free_port
from tests.webui.conftest import WebClient

FAST = {"REVEILLE_TIMERS_MIN_DELAY_SECONDS": "1"}  # the default floor is 10 s


async def _start(home: Path) -> tuple[Server, WebClient]:
    port = free_port()
    server = await asyncio.to_thread(
        Server, home, extra_env={**FAST, "REVEILLE_WEBUI_PORT": str(port)}
    )
    server.wait_for(re.compile(rf"web UI: http://127\.0\.0\.1:{port}/"))
    return server, await WebClient.open(port)


def _timers(home: Path) -> list[str]:
    return [r.delivery_state for r in ledger_rows(home) if r.kind == "timer"]


async def test_a_reminder_is_one_card_across_a_sigkill(tmp_path: Path) -> None:
    first, web = await _start(tmp_path)
    try:
        sid = await web.new_session("reminders")
        await web.say(sid, "remind me in 3 seconds: call the plumber")
        set_at = time.monotonic()
        await asyncio.to_thread(wait_until, lambda: _timers(tmp_path) == ["pending"])
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - set_at)))
    finally:
        await web.close()
        first.stop(signal.SIGKILL)
    assert _timers(tmp_path) == ["pending"]  # killed before it was due

    second, web = await _start(tmp_path)
    try:
        await asyncio.to_thread(wait_until, lambda: _timers(tmp_path) == ["delivered"], 30)

        async def replied() -> list[dict]:
            items = (await web.session(sid))["items"]
            return [i for i in items if i["kind"] == "message" and i["wakeup"]]

        deadline = time.monotonic() + 30
        while not await replied() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # a second card or reply would show by now
        items = (await web.session(sid))["items"]
        cards = [i for i in items if i["kind"] == "wakeup"]
        assert len(cards) == 1, items
        assert cards[0]["card"]["work_kind"] == "scheduled_wakeup"
        assert cards[0]["card"]["goal"] == "call the plumber"
        replies = await replied()
        assert len(replies) == 1, items
        assert "Reminder: call the plumber" in replies[0]["content"]
        [row] = [r for r in ledger_rows(tmp_path) if r.kind == "timer"]
        assert row.delivery_attempts == 1
    finally:
        await web.close()
        second.stop()
