"""Reminders on a push surface: `reveille serve` with Telegram (the fake Bot API on loopback)
and the real ledger. A reminder that comes due is an ordinary completion: the re-offer
scheduler offers it when due, reminders due together are ONE wake-up turn restating each
note, and one that comes due while a wake-up turn runs waits, unclaimed, for the next."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from delivery.events import SCHEDULED_WAKEUP, TIMER_KIND
from tests.gateway.test_combined_wakeups import _finished, _ids_in, _row, _until, bot, stack

__all__ = ["bot", "stack"]  # the fixtures, shared with the combined wake-up tests


def _remind(app: Any, row_id: str, session_id: str, note: str, due: float) -> None:
    event = {
        "type": SCHEDULED_WAKEUP,
        "delivery_id": row_id,
        "status": "completed",
        "note": note,
        "due_at": due,
        "session_key": session_id,
        "origin_session_id": session_id,
        "dispatched_at": time.time(),
        "completed_at": due,
    }
    app.runtime.ledger.schedule(
        row_id,
        kind=TIMER_KIND,
        event=event,
        not_before=due,
        session_key=session_id,
        origin_session_id=session_id,
        goal=note,
    )


async def test_reminders_due_together_are_one_pushed_wake_up(stack, bot) -> None:
    app, model, session_id = stack
    due = time.time() + 1.0
    _remind(app, "tmr_tea", session_id, "put the kettle on", due)
    _remind(app, "tmr_cat", session_id, "feed the cat", due)
    assert _row("tmr_tea")["delivery_state"] == "pending"

    await _until(
        lambda: all(_row(i)["delivery_state"] == "delivered" for i in ["tmr_tea", "tmr_cat"])
    )
    await _until(lambda: bot.texts_to(42))
    [wake] = model.wakes
    assert sorted(_ids_in(wake)) == ["tmr_cat", "tmr_tea"]
    assert "put the kettle on" in wake and "feed the cat" in wake
    assert len(bot.texts_to(42)) == 1
    assert [_row(i)["delivery_attempts"] for i in ["tmr_tea", "tmr_cat"]] == [1, 1]


async def test_a_reminder_due_while_a_wake_up_runs_waits_for_the_next(stack, bot) -> None:
    app, model, session_id = stack
    model.hold.set()
    first = _finished(app, "proc_first", session_id)
    running = asyncio.create_task(app.runner.handle_event(first))
    await _until(lambda: len(model.wakes) == 1)  # its turn runs (held in the model)

    _remind(app, "tmr_late", session_id, "stand up", time.time() + 0.5)
    await _until(lambda: time.time() > _row("tmr_late")["not_before"] + 1.0)
    assert len(model.wakes) == 1  # no second turn while the first runs
    assert _row("tmr_late")["delivery_attempts"] == 0  # waiting unclaimed

    model.hold.clear()
    model.released.set()
    assert await running == "delivered"
    await _until(lambda: _row("tmr_late")["delivery_state"] == "delivered")
    assert [_ids_in(w) for w in model.wakes] == [["proc_first"], ["tmr_late"]]
    assert "stand up" in model.wakes[1]
    assert _row("tmr_late")["delivery_attempts"] == 1
    await _until(lambda: len(bot.texts_to(42)) == 2)
