"""The demo model's reminders: "remind me in <N> seconds: <text>" calls `schedule_wakeup`,
and the wake-up of a fired reminder is answered by restating its text."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agent.providers.demo import DemoModel
from delivery.events import SCHEDULED_WAKEUP
from gateway.wake_text import format_wake_text
from tools.wakeup_tool import make_wakeup_tool

NOW = 1_800_000_000.0


def _event(note: str) -> dict[str, Any]:
    return {
        "type": SCHEDULED_WAKEUP,
        "delivery_id": "tmr_1",
        "status": "completed",
        "note": note,
        "due_at": NOW,
        "dispatched_at": NOW - 30,
        "completed_at": NOW,
    }


def test_the_demo_model_sets_a_reminder_and_restates_it_when_it_fires() -> None:
    model = DemoModel(delay_seconds=0)
    tools = [make_wakeup_tool().schema()]
    messages = [{"role": "user", "content": "remind me in 30 seconds: stretch your legs"}]
    reply = asyncio.run(model.complete(messages, tools=tools))
    [call] = reply.tool_calls
    assert call["function"]["name"] == "schedule_wakeup"
    assert json.loads(call["function"]["arguments"]) == {
        "in_seconds": 30,
        "note": "stretch your legs",
    }
    wake = format_wake_text(_event("stretch your legs"), now=NOW)
    answer = asyncio.run(model.complete([{"role": "user", "content": wake}], tools=tools))
    assert answer.content == "Reminder: stretch your legs"
    refused = asyncio.run(model.complete(messages, tools=[]))
    assert "can't set reminders" in (refused.content or "")


def test_the_demo_model_says_when_the_reminder_is_due_or_why_not() -> None:
    model = DemoModel(delay_seconds=0)
    tools = [make_wakeup_tool().schema()]
    call = {
        "id": "call_demo_1",
        "type": "function",
        "function": {
            "name": "schedule_wakeup",
            "arguments": json.dumps({"in_seconds": 3, "note": "tea"}),
        },
    }
    ask = {"role": "user", "content": "remind me in 3 seconds: tea"}
    said = {"role": "assistant", "content": None, "tool_calls": [call]}
    ok = {"wakeup_id": "tmr_9", "due_at": "2027-01-01T00:00:03Z", "status": "scheduled"}
    done = {"role": "tool", "tool_call_id": "call_demo_1", "content": json.dumps(ok)}
    reply = asyncio.run(model.complete([ask, said, done], tools=tools))
    assert reply.content == (
        "Reminder set for 2027-01-01T00:00:03Z (id tmr_9): tea. I'll bring it back here then."
    )
    bad = {**done, "content": json.dumps({"error": "a wake-up must be at least 10 seconds"})}
    refused = asyncio.run(model.complete([ask, said, bad], tools=tools))
    assert refused.content == "I couldn't set the reminder: a wake-up must be at least 10 seconds"
