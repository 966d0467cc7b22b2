"""Fixtures of the Discord tests: the stand-in, and the adapter over a real TurnService."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.approvals import Approvals
from gateway.config import Platform
from gateway.session import SessionStore
from gateway.surfaces.discord import DiscordAdapter
from gateway.turns.service import TurnService
from tests.discord.fake_discord import FakeDiscord
from tests.stores import memory_sessions

OWNER = "42"
OTHER = "43"  # allowed too, but owns no conversation of OWNER's
STRANGER = "66"  # not allowed


@dataclass
class _Result:
    content: str
    usage: Any = None


class ScriptedModel:
    """Answers every turn with ``reply``, streamed word by word; a message "run <command>"
    asks to run the command first (an approval) and answers with what came of it."""

    def __init__(self, reply: str = "one two three four") -> None:
        self.reply = reply
        self.turns: list[str] = []
        self.gate: asyncio.Event | None = None  # set: turns wait for it before answering

    async def __call__(self, messages: Any, ctx: Any, on_delta: Any) -> _Result:
        text = messages[-1]["content"]
        self.turns.append(text)
        if self.gate is not None:
            await self.gate.wait()
        if text.startswith("run "):
            ok = await ctx.confirm(text[4:])
            return _Result(f"**ran** `{text[4:]}`" if ok else "not run: denied")
        if on_delta is not None:
            for word in self.reply.split(" "):
                await on_delta(word + " ")
                await asyncio.sleep(0)
        return _Result(self.reply)


@dataclass
class Rig:
    adapter: DiscordAdapter
    fake: FakeDiscord
    model: ScriptedModel
    store: SessionStore
    approvals: Approvals
    extra: dict[str, Any] = field(default_factory=dict)


async def until(check: Callable[[], object], timeout: float = 10.0) -> None:
    """Wait (polling the loop) until ``check()`` is truthy."""
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    fake = await FakeDiscord().start()
    model = ScriptedModel()
    store = SessionStore(memory_sessions())
    approvals = Approvals(store, timeout_seconds=30, poll_seconds=0.05)
    turns = TurnService(
        store,
        model,
        render=lambda r: {"content": r.content},
        platform=Platform.DISCORD,
        session_key_of=lambda s: s,
        confirm_for=approvals.confirm_for,
        hold_sessions=True,
    )
    adapter = DiscordAdapter(
        token=fake.token,
        turns=turns,
        allowed_users=frozenset({OWNER, OTHER}),
        api_base=fake.api_base,
        approvals=approvals,
        edit_interval=0.01,
    )
    await adapter.start()
    try:
        await fake.wait_connected()  # READY and GUILD_CREATE sent
        yield Rig(adapter, fake, model, store, approvals)
    finally:
        await adapter.stop(grace_seconds=1)
        store.close()
        await fake.stop()
