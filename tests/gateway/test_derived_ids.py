"""``derive_session_id``: the id a conversation is found by never changes between versions
(a client's next request must land in the session its first one created)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.turns.conversation import derive_session_id

# Each id as the release before the one-pass derivation computed it.
CASES: list[tuple[list[dict[str, Any]], str]] = [
    ([{"role": "user", "content": "hello"}], "api_3992ba9588512fe31b117c87"),
    (
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi é \u2028"},
            {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "second"},
        ],
        "api_01867ba706da2cbcf0615698",
    ),
    (
        # Two system prompts (one in parts), and a first user message that is empty.
        [
            {"role": "system", "content": "a"},
            {"role": "system", "content": [{"type": "text", "text": "b"}]},
            {"role": "user", "content": ""},
            {"role": "user", "content": "later"},
        ],
        "api_7619faaec5455abf908dc020",
    ),
    ([{"role": "assistant", "content": "x"}], "api_3bb0807ada97b54f318cd31d"),
]


@pytest.mark.parametrize(("messages", "expected"), CASES)
def test_a_conversation_keeps_its_derived_id(messages: list[dict[str, Any]], expected: str) -> None:
    assert derive_session_id(messages) == expected
