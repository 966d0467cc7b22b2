"""What the Slack adapter takes from an event or a payload, and what it leaves: a user's
message (in a DM, a channel, a thread, an ``app_mention`` without the bot's name) but not an
edit, a join or a bot's message; an approval's press but nothing else."""

from __future__ import annotations

from typing import Any

from agent.messages import JSONObject
from gateway.surfaces.slack.intake import clean, inbox_id, message_of, press_of, slack_session_id


def _envelope(**event: Any) -> JSONObject:
    base = {"type": "message", "channel": "D0OWNER", "channel_type": "im", "user": "U0OWNER"}
    return {
        "type": "event_callback",
        "event_id": "Ev1",
        "event": {**base, "ts": "1.000001", **event},
    }


def test_a_users_message_in_a_dm_a_channel_and_a_thread() -> None:
    dm = message_of(_envelope(text="hi"))
    assert dm is not None and dm.source.chat_type == "dm" and dm.source.thread_id is None
    channel = message_of(_envelope(text="hi", channel="C1", channel_type="channel"))
    assert channel is not None and channel.source.chat_type == "channel"
    thread = message_of(_envelope(text="hi", channel="C1", thread_ts="0.000100"))
    assert thread is not None
    assert (thread.source.chat_type, thread.source.thread_id) == ("thread", "0.000100")
    sessions = {slack_session_id(m.source) for m in (dm, channel, thread)}
    assert len(sessions) == 3


def test_a_mention_loses_the_bots_name() -> None:
    found = message_of(_envelope(type="app_mention", text="<@UBOT> do it", channel="C1"))
    assert found is not None and found.text == "do it"


def test_edits_joins_bots_and_empty_messages_are_left() -> None:
    for event in (
        {"text": "edited", "subtype": "message_changed"},
        {"text": "joined", "subtype": "channel_join"},
        {"text": "beep", "bot_id": "B1"},
        {"text": "   "},
        {"text": "no user", "user": None},
        {"type": "reaction_added", "text": "x"},
    ):
        assert message_of(_envelope(**event)) is None, event
    assert message_of({"type": "event_callback", "event": "not an object"}) is None


def test_only_an_approvals_press_is_a_press() -> None:
    payload: JSONObject = {
        "type": "block_actions",
        "user": {"id": "U0OWNER"},
        "channel": {"id": "D0OWNER"},
        "message": {"ts": "1.000002"},
        "actions": [{"action_id": "reveille_deny", "value": "ap_1"}],
    }
    pressed = press_of(payload)
    assert pressed is not None
    assert (pressed.press.approval_id, pressed.press.approve) == ("ap_1", False)
    assert press_of({**payload, "actions": [{"action_id": "other", "value": "x"}]}) is None
    assert press_of({**payload, "type": "view_submission"}) is None
    assert press_of({**payload, "user": "U0OWNER"}) is None
    assert press_of({**payload, "actions": []}) is None


def test_lone_surrogates_are_replaced_and_ids_are_stable() -> None:
    assert clean({"t\ud800": ["a\udfffb", 1, None]}) == {"t\ufffd": ["a\ufffdb", 1, None]}
    assert clean("\U0001f600") == "\U0001f600"
    assert inbox_id("Ev1") == inbox_id("Ev1") != inbox_id("Ev2")
    assert 0 <= inbox_id("Ev1") < 2**60
