"""Shared helpers for the API server tests: a real server on an ephemeral loopback port."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import openai

from agent import Agent
from agent.markers import SUBAGENT_MARKER
from agent.providers.demo import DemoModel
from agent.tools import ToolContext
from gateway.session import SessionStore
from gateway.surfaces.api_server.adapter import ApiServerAdapter, agent_turn_runner
from tools.toolset import build_default_registry

KEY = "test-key-123"
DEMO_DELAY = 0.05


class RecordingProvider:
    """Wraps a provider and keeps every top-level model context it was asked about."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.contexts: list[list[dict[str, Any]]] = []

    async def complete(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        is_subagent = any(SUBAGENT_MARKER in str(m.get("content") or "") for m in messages)
        if not is_subagent:
            self.contexts.append([dict(m) for m in messages])
        return await self.inner.complete(messages, **kwargs)


class CountingRunner:
    """A turn runner that counts concurrent turns and can be slowed down."""

    def __init__(self, inner: Callable[..., Any], delay: float = 0.0) -> None:
        self.inner = inner
        self.delay = delay
        self.running = 0
        self.max_running = 0
        self.calls = 0

    async def __call__(
        self, messages: list[dict[str, Any]], ctx: ToolContext, on_delta: Any, **options: Any
    ) -> Any:
        self.calls += 1
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            return await self.inner(messages, ctx, on_delta, **options)
        finally:
            self.running -= 1


def demo_agent(provider: Any, *, shell_enabled: bool = False) -> Agent:
    return Agent(provider, build_default_registry(provider, shell_enabled=shell_enabled))


@contextlib.asynccontextmanager
async def running_adapter(
    store: SessionStore,
    *,
    api_key: str = KEY,
    delay: float = 0.0,
    **kwargs: Any,
) -> AsyncIterator[tuple[ApiServerAdapter, RecordingProvider, CountingRunner]]:
    provider = RecordingProvider(DemoModel(delay_seconds=DEMO_DELAY))
    runner = CountingRunner(agent_turn_runner(demo_agent(provider)), delay=delay)
    adapter = ApiServerAdapter(
        store=store,
        turn_runner=runner,
        host="127.0.0.1",
        port=0,
        api_key=api_key,
        model_name=provider.name,
        **kwargs,
    )
    await adapter.start()
    try:
        yield adapter, provider, runner
    finally:
        await adapter.stop()


def client_for(port: int, key: str | None = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key=key or "no-key",
        max_retries=0,
        timeout=30,
    )


async def poll(check: Callable[[], Any], *, timeout: float = 15.0, interval: float = 0.05) -> Any:
    """Await ``check()`` (sync or async) until it returns something truthy, or fail."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)
