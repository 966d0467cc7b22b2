"""The `schedule` tool: create (cron + tz or an interval), list, pause, resume, cancel; its
errors; who gets it; the demo's "every N seconds:"; the wake text of an occurrence and of a
missed one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import storage
from agent.providers.demo import DemoModel
from agent.tools import ToolContext
from api.views import DELIVERY_TITLES
from delivery.events import SCHEDULED_WAKEUP
from delivery.rows import RowQuery
from delivery.schedules import SCHEDULE_KIND
from delivery.schedules_engine import ScheduleEngine
from gateway.config import Platform
from gateway.delivery_targets import session_platform
from gateway.schedule_conversations import conversation_opener
from gateway.session import SessionSource, SessionStore
from gateway.wake_text import format_wake_text
from tools import schedule_tool
from tools.async_delegation import configure_runtime
from tools.completion_queue import CompletionQueue
from tools.delegate_tool import subagent_toolsets
from tools.delegation_runtime import reset_runtime
from tools.schedule_tool import MAX_SCHEDULES_PER_SESSION, make_schedule_tool
from tools.toolset import build_default_registry
from tools.wakeup_tool import WAKEUP_TOOLSET

NOW = 1_800_000_000.0


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[ScheduleEngine]:
    runtime = configure_runtime(str(tmp_path / "ledger.db"), completion_queue=CompletionQueue())
    store = storage.sqlite_files(ledger=tmp_path / "ledger.db").open_schedules()
    made = ScheduleEngine(runtime.ledger, store)
    schedule_tool.install(made)
    yield made
    schedule_tool.install(None)
    store.close()
    reset_runtime()


def call(args: dict[str, Any], session: str = "api-1") -> dict[str, Any]:
    ctx = ToolContext(session_id=session, session_key=f"key-{session}")
    return asyncio.run(make_schedule_tool().handler(args, ctx))  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"action": "explode"}, "action must be one of"),
        ({"action": "create", "every_seconds": 60}, "note must be a non-empty string"),
        ({"action": "create", "note": "x"}, "exactly one of cron"),
        ({"action": "create", "note": "x", "cron": "61 * * * *"}, "bad cron expression"),
        ({"action": "create", "note": "x", "cron": "0 9 * * *", "tz": "Mars/Base"}, "unknown"),
        ({"action": "create", "note": "x", "every_seconds": 5}, "at least 10"),
        ({"action": "create", "note": "x", "cron": "* * * * * */5"}, "the period must be"),
        ({"action": "create", "note": "x", "every_seconds": 60, "misfire": "later"}, "misfire"),
        ({"action": "create", "note": "x", "every_seconds": 60, "target": "own"}, "not available"),
        ({"action": "create", "note": "x", "every_seconds": 60, "target": "far"}, "target must"),
        ({"action": "pause"}, "needs the schedule's id"),
        ({"action": "cancel", "id": "sch_nope"}, "not found"),
    ],
)
def test_bad_requests_get_clear_errors(
    engine: ScheduleEngine, args: dict[str, Any], error: str
) -> None:
    result = call(args)
    assert error in result["error"]
    assert engine.find(include_cancelled=True) == []


def test_create_list_pause_resume_cancel(engine: ScheduleEngine) -> None:
    made = call(
        {
            "action": "create",
            "note": "summarise the overnight alerts",
            "cron": "0 9 * * 1-5",
            "tz": "Europe/Berlin",
            "misfire": "fire_if_within 15m",
        }
    )
    assert made["status"] == "scheduled" and made["tz"] == "Europe/Berlin"
    assert made["next_due_at"].endswith(("+01:00", "+02:00"))  # shown in its zone
    assert made["misfire"] == "fire_if_within 900s"
    listed = call({"action": "list"})["schedules"]
    assert [s["id"] for s in listed] == [made["id"]]
    assert call({"action": "list"}, session="api-2")["schedules"] == []
    assert "not found" in call({"action": "cancel", "id": made["id"]}, session="api-2")["error"]
    assert call({"action": "pause", "id": made["id"]})["state"] == "paused"
    assert call({"action": "resume", "id": made["id"]})["state"] == "active"
    assert call({"action": "cancel", "id": made["id"]})["state"] == "cancelled"
    assert call({"action": "list"})["schedules"] == []


def test_at_most_fifty_per_conversation(engine: ScheduleEngine) -> None:
    for i in range(MAX_SCHEDULES_PER_SESSION):
        assert call({"action": "create", "note": f"n{i}", "every_seconds": 60})["status"]
    over = call({"action": "create", "note": "one more", "every_seconds": 60})
    assert "already has 50 schedules" in over["error"]
    assert call({"action": "create", "note": "elsewhere", "every_seconds": 60}, "api-2")["id"]


def test_without_an_engine_it_says_so() -> None:
    assert "not available" in call({"action": "list"})["error"]


def test_a_conversation_gets_it_and_a_sub_agent_only_when_named() -> None:
    registry = build_default_registry(DemoModel(delay_seconds=0), shell_enabled=False)
    assert "schedule" in {tool.name for tool in registry.tools()}
    assert WAKEUP_TOOLSET not in subagent_toolsets(registry, None, may_delegate=False)
    assert subagent_toolsets(registry, ["schedule"], may_delegate=False) == [WAKEUP_TOOLSET]


def test_the_demo_model_repeats_every_n_seconds() -> None:
    model = DemoModel(delay_seconds=0)
    tools = [make_schedule_tool().schema()]
    ask = {"role": "user", "content": "every 10 seconds: drink water"}
    reply = asyncio.run(model.complete([ask], tools=tools))
    [tool_call] = reply.tool_calls
    assert tool_call["function"]["name"] == "schedule"
    assert json.loads(tool_call["function"]["arguments"]) == {
        "action": "create",
        "every_seconds": 10,
        "note": "drink water",
    }
    refused = asyncio.run(model.complete([ask], tools=[]))
    assert "can't set schedules" in (refused.content or "")


def _occurrence(**extra: Any) -> dict[str, Any]:
    return {
        "type": SCHEDULED_WAKEUP,
        "delivery_id": "sch_1-20270115T080000Z",
        "status": "completed",
        "note": "drink water",
        "due_at": NOW,
        "zone": "Europe/Berlin",
        "schedule_id": "sch_1",
        "schedule": "every 10 s",
        "dispatched_at": NOW - 600,
        "completed_at": NOW,
        **extra,
    }


def test_an_occurrence_says_which_schedule_and_how_many_were_missed() -> None:
    text = format_wake_text(_occurrence(missed=4), now=NOW)
    assert "an occurrence of a schedule you set is due" in text
    assert "Schedule: sch_1 (every 10 s)" in text
    assert "Missed: 4 more occurrence(s)" in text and "drink water" in text


def test_a_missed_occurrence_is_a_visible_notice_not_an_order() -> None:
    text = format_wake_text(_occurrence(status="missed", missed=2), now=NOW)
    assert "[Missed occurrence]" in text and "Do not act on the note" in text
    assert DELIVERY_TITLES["schedule_missed"] == "Missed occurrence"
    model = DemoModel(delay_seconds=0)
    answer = asyncio.run(model.complete([{"role": "user", "content": text}], tools=[]))
    assert answer.content == "Missed (not run): drink water"


@pytest.fixture
def sessions() -> Iterator[SessionStore]:
    store = SessionStore(storage.open_storage("memory://own").open_sessions())
    yield store
    store.close()


def test_target_own_opens_a_conversation_of_its_own(
    engine: ScheduleEngine, sessions: SessionStore
) -> None:
    engine.open_conversation = conversation_opener(sessions)
    sessions.create_session("api-1", title="asking")
    made = call({"action": "create", "note": "daily digest", "every_seconds": 60, "target": "own"})
    assert made["status"] == "scheduled" and made["target"] == "own", made
    own_id = made["session"]
    assert own_id != "api-1"
    own = sessions.get_session(own_id)
    assert own is not None and session_platform(own) is Platform.API_SERVER
    assert own.title == "Schedule: daily digest"
    [row] = engine.ledger.query(RowQuery(kind=SCHEDULE_KIND, delivery_state="pending"))
    assert row.origin_session_id == own_id  # its occurrences come home there
    # The asking conversation lists it no more; the new one does.
    assert call({"action": "list"})["schedules"] == []
    assert [s["id"] for s in call({"action": "list"}, session=own_id)["schedules"]] == [made["id"]]


def test_target_own_from_the_web_ui_is_a_web_ui_session(
    engine: ScheduleEngine, sessions: SessionStore
) -> None:
    engine.open_conversation = conversation_opener(sessions)
    ctx = ToolContext(session_id="ui-1", session_key="k", origin_ui_session_id="ui-1")
    args = {"action": "create", "note": "stretch", "every_seconds": 60, "target": "own"}
    made = asyncio.run(make_schedule_tool().handler(args, ctx))
    own = sessions.get_session(made["session"])  # type: ignore[index]
    assert own is not None and session_platform(own) is Platform.WEBUI


def test_target_own_is_refused_on_a_chat_platform(
    engine: ScheduleEngine, sessions: SessionStore
) -> None:
    engine.open_conversation = conversation_opener(sessions)
    source = SessionSource(platform=Platform.TELEGRAM, chat_id="42")
    sessions.create_session("tg-1", source=source)
    args = {"action": "create", "note": "n", "every_seconds": 60, "target": "own"}
    refused = call(args, session="tg-1")
    assert "API and web UI conversations only" in refused["error"]
    assert engine.find(include_cancelled=True) == []
