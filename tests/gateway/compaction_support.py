"""A long conversation for the compaction tests: the turn service over a real store and an
OpenAI-compatible model on loopback, background results arriving as delivery rows, and a
model that counts what every call saw.

``drive`` runs turns (in the test's process, or in ``compaction_child.py`` that a test kills);
``CountingModel`` is the handler of ``tests.agent.test_openai_compat.FakeOpenAI`` that
records each call and checks, as it happens, that a summarisation call is never shown a
result no stored turn saw.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from agent.loop import Agent
from agent.markers import SUMMARISE_MARKER
from agent.providers.openai_compat import OpenAICompatProvider
from agent.tools import ToolRegistry
from gateway.config import Platform
from gateway.session import SessionSource, SessionStore
from gateway.turns.compaction import CompactionPolicy, Compactor, provider_summariser
from gateway.turns.service import (
    StartedTurn,
    TurnError,
    TurnRequest,
    TurnService,
    agent_turn_runner,
)
from tests.sessions._support import make_session

SESSION = "api_compaction_test"
TOKEN = re.compile(r"RESULT-\d+")
POLICY = CompactionPolicy(context_window=2000, summary_chars=600, input_chars=6000)


def deliveries_at(turn: int) -> list[int]:
    """The results that arrive just before ``turn`` (some turns get none, some two)."""
    if turn % 5 == 0:
        return [turn]
    if turn % 13 == 0:
        return [turn, turn + 1000]
    return []


def deliver(store: SessionStore, n: int) -> None:
    store.append_message(
        SESSION,
        "system",
        f"[reveille:wake] Background task deleg_{n:05d} finished. RESULT-{n}: "
        + "the answer is " * 12,
        display_kind="async_delegation_complete",
        display_metadata={
            "kind": "delegation",
            "delegation_id": f"deleg_{n:05d}",
            "goal": f"goal number {n}",
            "status": "completed",
        },
        dedupe_key=f"deleg:{n}",
    )


def service_for(store: SessionStore, base_url: str) -> TurnService:
    provider = OpenAICompatProvider(base_url, "k", "fake-model", 30.0, max_retries=0)
    return TurnService(
        store,
        agent_turn_runner(Agent(provider, ToolRegistry())),
        render=lambda result: {"content": str(result.content or "")},
        platform=Platform.API_SERVER,
        compactor=Compactor(store, provider_summariser(provider), POLICY),
    )


def open_session(store: SessionStore) -> None:
    make_session(store, SESSION, source=SessionSource(Platform.API_SERVER, chat_id=SESSION))


async def turn(service: TurnService, n: int) -> bool:
    """One user turn; False when the model failed it (nothing stored)."""
    text = f"message {n}: " + "please keep this in mind " * 6
    started = await service.start(
        TurnRequest(session_id=SESSION, messages=[{"role": "user", "content": text}])
    )
    assert isinstance(started, StartedTurn)
    try:
        await started.task
    except TurnError as exc:
        assert exc.kind == "upstream", exc
        return False
    return True


async def drive(
    store: SessionStore,
    service: TurnService,
    turns: range,
    after: Callable[[int, bool], None] = lambda n, ok: None,
) -> None:
    for n in turns:
        for d in deliveries_at(n):
            deliver(store, d)
        after(n, await turn(service, n))


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


@dataclass
class Call:
    summarise: bool
    ok: bool
    tokens: list[str]  # every token in the context, with repeats


@dataclass
class CountingModel:
    """What the fake model saw, call by call, and the checks made while it runs."""

    calls: list[Call] = field(default_factory=list)
    committed: set[str] = field(default_factory=set)  # seen by a call of a stored turn
    violations: list[str] = field(default_factory=list)
    refuse_next: int = 0  # answer the next normal calls "context length exceeded"
    fail_next: int = 0  # answer the next normal calls with a 500
    hang_summaries: bool = False
    summary_started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)  # ends a hung call

    async def __call__(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        messages = body["messages"]
        if any(SUMMARISE_MARKER in str(m.get("content")) for m in messages):
            return await self._summarise(messages)
        seen = [t for m in messages for t in tokens(str(m.get("content") or ""))]
        call = Call(False, True, seen)
        self.calls.append(call)
        if self.refuse_next:
            self.refuse_next -= 1
            call.ok = False
            return web.json_response(
                {
                    "error": {
                        "message": "This model's maximum context length is 2000 tokens.",
                        "type": "invalid_request_error",
                        "code": "context_length_exceeded",
                    }
                },
                status=400,
            )
        if self.fail_next:
            self.fail_next -= 1
            call.ok = False
            return web.json_response({"error": {"message": "boom"}}, status=500)
        return _completion(f"reply {len(self.calls)}")

    async def _summarise(self, messages: list[dict[str, Any]]) -> web.StreamResponse:
        shown = [t for m in messages for t in tokens(str(m.get("content") or ""))]
        early = sorted(set(shown) - self.committed)
        if early:
            self.violations.append(f"summarised before a stored turn saw them: {early}")
        self.calls.append(Call(True, True, shown))
        if self.hang_summaries:
            self.summary_started.set()
            await asyncio.wait_for(self.release.wait(), 120)
        return _completion("The user kept asking us to keep things in mind. " * 4)

    def turn_stored(self) -> None:
        """The turn whose last call was answered was stored: what it saw is committed."""
        last = next((c for c in reversed(self.calls) if not c.summarise), None)
        if last is not None and last.ok:
            self.committed.update(last.tokens)


def _completion(content: str) -> web.Response:
    return web.json_response(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "fake-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )
