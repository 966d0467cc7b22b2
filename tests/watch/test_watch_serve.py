"""Watches through real `reveille serve` processes, with a fake OpenAI-compatible model on
loopback that sets the watch (and counts every model call).

A watch on a background command's output, set through the tools the model calls
(`terminal` in the background, then `watch` with its process id), fires once when the
command prints the line, with no model call from its creation to its firing.

An interval-command watch set over the API survives a SIGKILL of its server: the restarted
server adopts it, and once the command exits 0 it fires exactly once, as one
``scheduled_wakeup`` row of the session's transcript restating the note. No model call is
made from the watch's creation to its firing (nor by the firing: an API session's client
owns the next turn).
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.wake import WAKEUP_DISPLAY_KIND
from tests.agent.test_openai_compat import FakeOpenAI, _completion_body, completion
from tests.agent.test_subagent_tools import fake, tool_call
from tests.api_server.serve_support import Server, chat, ledger_rows, transcript, wait_until

__all__ = ["fake"]  # the fake model's fixture, used by name


def _env(fake: FakeOpenAI) -> dict[str, str]:
    return {
        "REVEILLE_PROVIDER": "openai",
        "REVEILLE_MODEL": "fake-model",
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "sk-test",
    }


def _wakeups(port: int, session_id: str) -> list[dict[str, Any]]:
    return [m for m in transcript(port, session_id) if m["display_kind"] == WAKEUP_DISPLAY_KIND]


async def test_an_interval_watch_fires_once_across_a_sigkill_at_no_model_cost(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    flag = tmp_path / "deployed"
    fake.script = [
        completion(
            None,
            [
                tool_call(
                    "w1",
                    "watch",
                    note="the deploy is live: tell the user",
                    command=f"test -f {flag} && echo live",
                    interval_seconds=5,
                )
            ],
        ),
        completion("I will tell you when the deploy is live."),
    ]
    first = await asyncio.to_thread(Server, home, extra_env=_env(fake))
    try:
        session_id, reply = await asyncio.to_thread(
            chat, first.port, "tell me when the deploy is live", model="fake-model"
        )
        assert reply == "I will tell you when the deploy is live."
        tool_result = json.loads(fake.requests[1]["body"]["messages"][-1]["content"])
        assert tool_result["status"] == "watching", tool_result
        watch_id = tool_result["watch_id"]
    finally:
        first.stop(signal.SIGKILL)
    calls = len(fake.requests)
    assert calls == 2
    [row] = [r for r in ledger_rows(home) if r.id == watch_id]
    assert row.state == "running" and row.kind == "watch"
    flag.touch()  # the condition comes true while no server runs

    second = await asyncio.to_thread(Server, home, extra_env=_env(fake))
    try:
        [wakeup] = await asyncio.to_thread(
            wait_until, lambda: _wakeups(second.port, session_id), 60.0
        )
        assert "the deploy is live: tell the user" in wakeup["content"]
        assert "exited 0" in wakeup["content"] and "live" in wakeup["content"]

        def settled() -> list[Any]:
            rows = {r.id: r for r in ledger_rows(home)}
            watch = rows[watch_id]
            return [watch] if watch.state == "completed" else []

        [watch] = await asyncio.to_thread(wait_until, settled)
        assert watch.delivery_state == "dropped"  # its one firing said it all
        fires = [r for r in ledger_rows(home) if r.id.startswith(watch_id + ".")]
        assert [(r.id, r.delivery_state) for r in fires] == [(f"{watch_id}.1", "delivered")]
        assert len(_wakeups(second.port, session_id)) == 1
        assert len(fake.requests) == calls  # not one model call from creation to firing
    finally:
        assert second.stop() == 0


def _watch_its_output(pattern: str, note: str) -> Any:
    """The model's second step: `watch` the process the `terminal` call just started."""

    async def handler(request: web.Request, body: dict[str, Any]) -> web.Response:
        started = json.loads(body["messages"][-1]["content"])
        call = tool_call(
            "w1", "watch", process_id=started["process_id"], pattern=pattern, note=note
        )
        return web.json_response(_completion_body(None, [call]))

    return handler


async def test_an_output_watch_set_by_the_model_fires_once_at_no_model_cost(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    command = (
        "sleep 1; echo compiling; echo 'build FAILED at step 3'; echo 'build FAILED at step 4'"
    )
    fake.script = [
        completion(None, [tool_call("t1", "terminal", command=command, background=True)]),
        _watch_its_output(r"FAILED at step \d", "the build broke: tell the user which step"),
        completion("I am watching the build."),
    ]
    server = await asyncio.to_thread(Server, tmp_path / "home", extra_env=_env(fake))
    try:
        session_id, reply = await asyncio.to_thread(
            chat, server.port, "build it and tell me if it fails", model="fake-model"
        )
        assert reply == "I am watching the build."
        calls = len(fake.requests)
        assert calls == 3
        [wakeup] = await asyncio.to_thread(
            wait_until, lambda: _wakeups(server.port, session_id), 30.0
        )
        assert "the build broke: tell the user which step" in wakeup["content"]
        assert "build FAILED at step 3" in wakeup["content"]
        # Its one firing (max_fires defaults to 1): the second matching line woke nobody.
        watch_id = json.loads(fake.requests[2]["body"]["messages"][-1]["content"])["watch_id"]

        def ended() -> list[Any]:
            rows = [r for r in ledger_rows(tmp_path / "home") if r.id == watch_id]
            return rows if rows and rows[0].state == "completed" else []

        [watch] = await asyncio.to_thread(wait_until, ended)
        assert watch.delivery_state == "dropped"
        fires = [r.id for r in ledger_rows(tmp_path / "home") if r.id.startswith(watch_id + ".")]
        assert fires == [f"{watch_id}.1"]
        assert len(_wakeups(server.port, session_id)) == 1
        assert len(fake.requests) == calls  # not one model call from creation to firing
    finally:
        assert server.stop() == 0
