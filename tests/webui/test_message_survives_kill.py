"""A user's message accepted with 202 survives its server being SIGKILLed mid-turn
(issue 29, item 6): after a restart the transcript shows it, failed with "the server
stopped before answering", and its Retry (the same text sent again) answers it.

Everything is real but the model (a fake OpenAI-compatible server in this test process),
which holds the first server's answer until that server is dead.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

from aiohttp import web

from api.web_turns import STOPPED_BEFORE_ANSWERING
from tests.api_server.serve_support import Server
from tests.webui.conftest import WebClient
from tests.webui.test_wakeup_crash import Upstream, start_server, until

TEXT = "KEEP-ME 4471: what is the answer?"


class HeldUpstream(Upstream):
    """The model; while ``held``, a request waits (the server is killed meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.held = True
        self.arrived = asyncio.Event()
        self.released = asyncio.Event()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.held:
            self.arrived.set()
            await self.released.wait()
            return web.Response(status=500)
        return await super()._handle(request)


def _messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [i for i in items if i.get("kind") == "message"]


async def test_a_message_accepted_before_a_kill_shows_failed_with_a_retry(tmp_path: Path) -> None:
    home = tmp_path / "home"
    upstream = HeldUpstream()
    await upstream.start()
    servers: list[Server] = []
    clients: list[WebClient] = []
    try:
        first, web_ui = await start_server(home, upstream)
        servers.append(first)
        clients.append(web_ui)
        sid = await web_ui.new_session()
        await web_ui.say(sid, TEXT)  # 202: accepted
        await asyncio.wait_for(upstream.arrived.wait(), 20)  # mid-turn: the model was asked
        # While the turn runs, the message shows once (as the running turn's question).
        running = await web_ui.session(sid)
        assert running["active_stream"]["user_text"] == TEXT
        assert not _messages(running["items"])
        first.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(first.proc.wait, 30)
        upstream.held = False
        upstream.released.set()

        second, web_ui = await start_server(home, upstream)
        servers.append(second)
        clients.append(web_ui)
        view = await web_ui.session(sid)
        assert view["active_stream"] is None
        shown = _messages(view["items"])
        assert [(m["role"], m["content"]) for m in shown] == [("user", TEXT)], shown
        assert shown[0]["failed"] is True and shown[0]["error"] == STOPPED_BEFORE_ANSWERING

        # Retry: the same text again, answered this time; the failed one gives way to it.
        await web_ui.say(sid, TEXT)

        async def answered() -> list[dict[str, Any]] | None:
            items = _messages((await web_ui.session(sid))["items"])
            return items if any(m["role"] == "assistant" for m in items) else None

        items = await until(answered)
        assert [(m["role"], m["content"], m.get("failed")) for m in items] == [
            ("user", TEXT, None),
            ("assistant", "It found forty-two.", None),
        ]
    finally:
        for client in clients:
            await client.close()
        for server in servers:
            await asyncio.to_thread(server.stop)
        upstream.released.set()
        await upstream.stop()
