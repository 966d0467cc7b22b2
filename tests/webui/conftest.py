"""A real ``reveille serve`` stack in-process: runner, API server and the web UI on free
loopback ports, real SQLite files in a temporary state directory, the demo model."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from agent.providers.demo import DemoModel
from api import config as cfg
from api.server import WebUIServer
from reveille.app import App, serve
from reveille.settings import Settings
from tests.ports import free_port
from tools.async_delegation import reset_runtime
from tools.process_registry import process_registry


@dataclass
class Sse:
    """One open event stream: events in arrival order."""

    response: aiohttp.ClientResponse
    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    async def pump(self) -> None:
        ident, kind, data = "", "message", ""
        async for raw in self.response.content:
            line = raw.decode().rstrip("\n")
            if not line:
                if data:
                    self.events.append((ident, kind, json.loads(data)))
                ident, kind, data = ident, "message", ""
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            if name == "id":
                ident = value
            elif name == "event":
                kind = value
            elif name == "data":
                data = value

    async def wait_for(self, pred: Any, timeout: float = 10.0) -> tuple[str, str, dict[str, Any]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            for event in self.events:
                if pred(event):
                    return event
            await asyncio.sleep(0.01)
        raise AssertionError(f"no matching event; got {[e[1] for e in self.events]}")

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for _, k, d in self.events if k == kind]

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.response.close()


class WebClient:
    """A browser tab's calls to one server's web UI (cookie and CSRF header included): of
    an in-process stack (``Web``) or of a `reveille serve` subprocess (``WebClient.open``)."""

    def __init__(self, http: aiohttp.ClientSession, base: str, csrf: str = "") -> None:
        self.http = http
        self.base = base
        self.csrf = csrf

    @classmethod
    async def open(cls, port: int, http: aiohttp.ClientSession | None = None) -> WebClient:
        """A client of the web UI on ``port`` with its CSRF token (a new session unless
        ``http`` is shared, which then also shares the login cookie)."""
        own = http or aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
        client = cls(own, f"http://127.0.0.1:{port}")
        async with own.get(client.base + "/api/bootstrap") as r:
            client.csrf = (await r.json())["csrf_token"]
        return client

    async def get(self, path: str, **kw: Any) -> aiohttp.ClientResponse:
        return await self.http.get(self.base + path, **kw)

    async def post(self, path: str, body: Any = None, **kw: Any) -> aiohttp.ClientResponse:
        headers = {"X-CSRF-Token": self.csrf, **kw.pop("headers", {})}
        return await self.http.post(self.base + path, json=body, headers=headers, **kw)

    async def new_session(self, title: str | None = "t") -> str:
        r = await self.post("/api/sessions", {"title": title})
        assert r.status == 201, await r.text()
        return str((await r.json())["session"]["id"])

    async def say(self, session_id: str, text: str) -> dict[str, Any]:
        r = await self.post(f"/api/sessions/{session_id}/messages", {"text": text})
        assert r.status == 202, await r.text()
        return dict(await r.json())

    async def stream(self, last_event_id: str | None = None) -> Sse:
        headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
        response = await self.http.get(self.base + "/api/events", headers=headers)
        assert response.status == 200
        sse = Sse(response)
        sse.task = asyncio.create_task(sse.pump())
        return sse

    async def session(self, session_id: str) -> dict[str, Any]:
        r = await self.get(f"/api/sessions/{session_id}")
        assert r.status == 200, await r.text()
        return dict(await r.json())

    async def close(self) -> None:
        await self.http.close()


class Web(WebClient):
    """A running in-process stack and a client of its web UI."""

    def __init__(
        self,
        app: App,
        server: WebUIServer,
        http: aiohttp.ClientSession,
        stack: contextlib.AsyncExitStack,
    ) -> None:
        super().__init__(http, f"http://127.0.0.1:{server.port}")
        self.app = app
        self.server = server
        self.stack = stack


class SlowDemo(DemoModel):
    """The demo model, streaming one word per ``step`` seconds; ``gate`` (when set) holds
    every streamed reply before its first word until it is set."""

    def __init__(self, step: float = 0.05) -> None:
        super().__init__(delay_seconds=0.0)
        self.step = step
        self.gate: asyncio.Event | None = None

    async def complete(self, messages: Any, *, tools: Any = None, on_delta: Any = None) -> Any:
        if on_delta is None:
            return await super().complete(messages, tools=tools)
        gate = self.gate

        async def slow(piece: str) -> None:
            if gate is not None:
                await gate.wait()
            await asyncio.sleep(self.step)
            await on_delta(piece)

        return await super().complete(messages, tools=tools, on_delta=slow)


def settings_for(tmp_path: Any, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "home": tmp_path / "home",
        "port": 0,
        "webui_port": free_port(),
        "api_key": "k",
        "demo_delay_seconds": 0.0,
    }
    values.update(overrides)
    return Settings(**values)


async def start_web(
    settings: Settings, *, provider: DemoModel | None = None, **serve_options: Any
) -> Web:
    stack = contextlib.AsyncExitStack()
    app = await stack.enter_async_context(
        serve(
            settings,
            provider=provider or DemoModel(delay_seconds=0.0),
            shutdown_grace_seconds=0.5,
            **serve_options,
        )
    )
    assert app.webui is not None
    http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    web = Web(app, app.webui, http, stack)
    boot = await (await web.get("/api/bootstrap")).json()
    web.csrf = boot["csrf_token"]
    return web


async def stop_web(web: Web) -> None:
    await web.http.close()
    await web.stack.aclose()


@pytest.fixture(autouse=True)
def _clean_process_state(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path / "home"))
    reset_runtime()
    process_registry.completion_queue.drain()
    yield
    reset_runtime()
    process_registry.completion_queue.drain()
    with cfg.MAPS_LOCK:
        cfg.DEFERRED_PROCESS_WAKEUPS.clear()
        cfg.PROCESS_SESSION_INDEX.clear()
        cfg.BG_TASK_COMPLETE_EVENTS_SEEN.clear()


@pytest.fixture
async def web(tmp_path: Any) -> AsyncIterator[Web]:
    running = await start_web(settings_for(tmp_path))
    try:
        yield running
    finally:
        await stop_web(running)
