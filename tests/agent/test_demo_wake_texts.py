"""The demo model reads the wake-up texts the gateway really writes (`gateway.wake`)."""

from __future__ import annotations

from agent.markers import DELIVERY_MARKER, WAKE_MARKER
from agent.providers.demo import DemoModel
from gateway import wake

NOW = 1_700_000_100.0


def _wake_text(evt):
    text = wake.format_wake_text(evt, now=NOW)
    assert text.startswith(WAKE_MARKER)  # what the demo model keys on
    return text


async def _summary(text, role="user"):
    reply = await DemoModel(delay_seconds=0).complete([{"role": role, "content": text}])
    assert reply.tool_calls == []
    return reply.content


async def test_completed_delegation():
    evt = {
        "type": "async_delegation",
        "delegation_id": "deleg_00ff",
        "goal": "count the stars",
        "context": "Status: this context line must not be read as the status",
        "model": "reveille-demo",
        "status": "completed",
        "summary": "Done: count the stars. (demo sub-agent result)\nNote: second line.",
        "dispatched_at": 1_700_000_000.0,
        "completed_at": 1_700_000_090.0,
        "duration_seconds": 90,
    }
    assert await _summary(_wake_text(evt)) == (
        "Background work finished: count the stars: completed. "
        "Result: Done: count the stars. (demo sub-agent result) Note: second line."
    )


async def test_failed_delegation_as_a_folded_delivery_row():
    evt = {
        "type": "async_delegation",
        "delegation_id": "deleg_0bad",
        "goal": "fetch the page",
        "status": "failed",
        "error": "connection refused",
        "dispatched_at": 1_700_000_000.0,
    }
    folded = f"{DELIVERY_MARKER}\n{_wake_text(evt)}"
    assert await _summary(folded, role="system") == (
        "Background work finished: fetch the page: failed. Result: connection refused"
    )


async def test_background_process_completion():
    evt = {
        "type": "completion",
        "process_id": "proc_1234",
        "command": "make test",
        "cwd": "/srv/app",
        "exit_code": 2,
        "status": "failed",
        "output_tail": "collecting\nerror: 1 test failed\nsummary: 3 passed\nmore",
        "duration_seconds": 3.5,
    }
    assert await _summary(_wake_text(evt)) == (
        "Background work finished: `make test`: exit code 2. "
        "Result: collecting | error: 1 test failed | summary: 3 passed"
    )


async def test_batch_delegation_gets_one_line_per_task():
    evt = {
        "type": "async_delegation",
        "delegation_id": "deleg_ba7c",
        "is_batch": True,
        "goals": ["first goal", "second goal"],
        "status": "completed",
        "results": [
            {"goal": "first goal", "status": "completed", "summary": "one"},
            {"goal": "second goal", "status": "failed", "error": "two broke"},
        ],
    }
    content = await _summary(_wake_text(evt))
    assert content.splitlines() == [
        "Background work finished: first goal: completed. Result: one",
        "Background work finished: second goal: failed. Result: two broke",
    ]
