"""Combined wake-ups on a push surface: `reveille serve` with Telegram (the fake Bot API on
loopback) and the real ledger. Results of one chat that finish together are ONE wake-up turn
listing each; each row is delivered once; a result that arrives while that turn runs joins
the next single wake-up; a refusal gives every claim of the batch back by the rule a single
one follows."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import tools.async_delegation as ad
from agent.markers import WAKE_MARKER, read_wake_data
from agent.providers.demo import DemoModel
from gateway.config import Platform
from gateway.session import SessionSource
from gateway.surfaces.telegram.adapter import telegram_session_id
from reveille.app import App, serve
from reveille.settings import Settings
from tests.api_server.serve_support import wait_until
from tests.sessions._support import make_session
from tests.telegram.fake_bot_api import FakeBotApi
from tools.process_registry import process_registry

SOURCE = SessionSource(platform=Platform.TELEGRAM, chat_id="42", user_id="42")


class GatedModel(DemoModel):
    """The demo model; records every wake-up it is asked to answer, and holds those calls
    while ``hold`` is set (a wake-up turn that is still running)."""

    def __init__(self) -> None:
        super().__init__(delay_seconds=0.0)
        self.wakes: list[str] = []
        self.hold = asyncio.Event()
        self.released = asyncio.Event()

    async def complete(self, messages: Any, **kwargs: Any) -> Any:
        last = str(messages[-1].get("content") or "") if messages else ""
        if last.startswith(WAKE_MARKER):
            self.wakes.append(last)
            if self.hold.is_set():
                await self.released.wait()
        return await super().complete(messages, **kwargs)


@pytest.fixture
def bot() -> Any:
    fake = FakeBotApi().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(autouse=True)
def fresh_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test's server gets a home of its own and starts and ends with no delegation
    runtime and no queued completion (torn down after the test's server has stopped)."""
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    ad.reset_runtime()
    process_registry.completion_queue.drain()
    yield
    ad.reset_runtime()
    process_registry.completion_queue.drain()


@contextlib.asynccontextmanager
async def _served(
    home: Path, bot: FakeBotApi, model: GatedModel, *, grace: float, **settings: Any
) -> AsyncIterator[tuple[App, str]]:
    """A server with the Telegram surface on ``bot`` and ``model``, and the chat's session."""
    chat = Settings(
        home=home,
        port=0,
        webui_port=0,
        api_key="k",
        telegram_bot_token=bot.token,
        telegram_base_url=bot.base_url,
        telegram_allowed_users="42",
        telegram_edit_interval=0.01,
        **settings,
    )
    async with serve(chat, provider=model, shutdown_grace_seconds=grace) as app:
        session_id = telegram_session_id(SOURCE)
        make_session(app.store, session_id, source=SOURCE)
        yield app, session_id


@pytest.fixture
async def stack(tmp_path: Path, bot: FakeBotApi) -> AsyncIterator[tuple[App, GatedModel, str]]:
    model = GatedModel()
    served = _served(tmp_path, bot, model, grace=0.5, max_async_children=10, coalesce_seconds=2.0)
    async with served as (app, session_id):
        yield app, model, session_id


def _row(row_id: str) -> dict[str, Any]:
    row = ad.get_durable_delegation(row_id)
    assert row is not None
    return dict(row)


async def _until(check: Any, timeout: float = 20.0) -> None:
    await asyncio.to_thread(wait_until, check, timeout)


def _dispatch_siblings(
    session_id: str, goals: list[str], gate: threading.Event | list[threading.Event]
) -> list[str]:
    """Siblings that run together and finish together once ``gate`` opens (or each once its
    own gate opens, given one per goal)."""
    gates = gate if isinstance(gate, list) else [gate] * len(goals)

    def runner_for(goal: str, opened: threading.Event) -> Any:
        def run() -> dict[str, Any]:
            opened.wait(10)
            return {"status": "completed", "summary": f"{goal}: done"}

        return run

    ids = []
    for goal, opened in zip(goals, gates, strict=True):
        res = ad.dispatch_async_delegation(
            goal=goal,
            runner=runner_for(goal, opened),
            session_key=session_id,
            origin_session_id=session_id,
            max_async_children=len(goals),
        )
        assert res["status"] == "dispatched", res
        ids.append(str(res["delegation_id"]))
    return ids


def _finished(app: App, row_id: str, session_id: str, summary: str = "ok") -> dict[str, Any]:
    """A process completion whose terminal row is in the ledger, ready to be delivered."""
    evt = {
        "type": "completion",
        "delivery_id": row_id,
        "dispatched_at": time.time(),
        "origin_session_id": session_id,
        "command": f"job {row_id}",
        "exit_code": 0,
        "output": summary,
    }
    ledger = app.runtime.ledger
    ledger.create(row_id, kind="process", state="running", request=evt, goal=row_id)
    assert ledger.finish(row_id, expected="running", state="completed", event=evt)
    return evt


def _ids_in(text: str) -> list[str]:
    return [str(m.get("delegation_id") or m.get("delivery_id")) for m in read_wake_data(text)]


async def test_ten_siblings_finishing_together_are_one_wake_up_turn(stack, bot) -> None:
    app, model, session_id = stack
    gate = threading.Event()
    goals = [f"survey region {i}" for i in range(10)]
    ids = await asyncio.to_thread(_dispatch_siblings, session_id, goals, gate)
    gate.set()

    await _until(lambda: all(_row(i)["delivery_state"] == "delivered" for i in ids))
    await _until(lambda: bot.texts_to(42))
    await asyncio.sleep(0.3)  # a second wake-up turn, had one started, would show by now

    [wake] = model.wakes
    assert sorted(_ids_in(wake)) == sorted(ids)
    assert "10 results arrived together: 10 completed" in wake
    for goal in goals:
        assert f"Goal: {goal}" in wake and f"{goal}: done" in wake
    assert [_row(i)["delivery_attempts"] for i in ids] == [1] * 10
    assert len(bot.texts_to(42)) == 1  # one reply in the chat, not ten
    stored = [m for m in app.store.messages(session_id) if m.content.startswith(WAKE_MARKER)]
    assert len(stored) == 1


async def test_a_result_arriving_while_the_wake_up_runs_joins_the_next_one(stack, bot) -> None:
    app, model, session_id = stack
    model.hold.set()
    first = _finished(app, "proc_first", session_id)
    running = asyncio.create_task(app.runner.handle_event(first))
    await _until(lambda: len(model.wakes) == 1)  # its turn runs (held in the model)

    later = [_finished(app, f"proc_later_{i}", session_id) for i in range(3)]
    waiting = []
    for count, evt in enumerate(later, start=1):
        # One after another: each is routed in a thread of its own, and threads started
        # together may finish in any order; the batch keeps the order they arrived in.
        waiting.append(asyncio.create_task(app.runner.handle_event(evt)))
        await _until(lambda n=count: app.runner._batches.waiting(session_id) == n)
    await asyncio.sleep(0.3)
    assert len(model.wakes) == 1  # no second turn while the first runs
    for i in range(3):  # waiting unclaimed: no attempt spent
        assert _row(f"proc_later_{i}")["delivery_attempts"] == 0

    model.hold.clear()
    model.released.set()
    assert await running == "delivered"
    assert await asyncio.gather(*waiting) == ["delivered"] * 3
    assert [_ids_in(w) for w in model.wakes] == [
        ["proc_first"],
        [f"proc_later_{i}" for i in range(3)],
    ]
    assert not model.wakes[0].startswith(f"{WAKE_MARKER} [Background work finished]")
    for row_id in ["proc_first"] + [f"proc_later_{i}" for i in range(3)]:
        row = _row(row_id)
        assert (row["delivery_state"], row["delivery_attempts"]) == ("delivered", 1)
    await _until(lambda: len(bot.texts_to(42)) == 2)


async def test_a_refused_combined_wake_up_releases_every_claim(stack, bot) -> None:
    app, model, session_id = stack
    evts = [_finished(app, f"proc_refused_{i}", session_id) for i in range(4)]
    for _ in range(2):  # the reply cannot be sent: transient, not the delivery's fault
        bot.fail("sendMessage", 502, "Bad Gateway")
    outcomes = await asyncio.gather(*(app.runner.handle_event(evt) for evt in evts))
    assert outcomes == ["released"] * 4
    assert len(model.wakes) == 1  # one turn was tried for all four
    for i in range(4):
        row = _row(f"proc_refused_{i}")
        # Released, refunded (retryable): pending, no attempt spent, no claim held.
        assert (row["delivery_state"], row["delivery_attempts"]) == ("pending", 0)

    # The ledger offers them again once their backoff ends: each is delivered once, with
    # one counted attempt (the refused one was refunded).
    ids = [f"proc_refused_{i}" for i in range(4)]
    await _until(lambda: all(_row(i)["delivery_state"] == "delivered" for i in ids))
    assert [_row(i)["delivery_attempts"] for i in ids] == [1] * 4


async def test_a_combined_wake_up_for_a_chat_that_is_gone_drops_every_row(stack, bot) -> None:
    app, _model, session_id = stack
    evts = [_finished(app, f"proc_gone_{i}", session_id) for i in range(3)]
    bot.blocked.add("42")  # the user blocked the bot: the chat is gone for good
    outcomes = await asyncio.gather(*(app.runner.handle_event(evt) for evt in evts))
    assert outcomes == ["dropped"] * 3
    for i in range(3):
        assert _row(f"proc_gone_{i}")["delivery_state"] == "dropped"


async def test_a_drain_delivers_results_still_in_their_coalescing_window(
    tmp_path: Path, bot: FakeBotApi
) -> None:
    """The server stops while one result waits out the coalescing window and its sibling
    still runs: the drain waits for the sibling, and its grace covers the wake-up, so both
    are delivered together before the server exits, not after a restart."""
    model = GatedModel()
    # A 5 s window is ample: it is still open when the sibling finishes during the stop.
    served = _served(tmp_path, bot, model, grace=10.0, coalesce_seconds=5.0, drain_seconds=20.0)
    async with served as (app, session_id):
        first, second = threading.Event(), threading.Event()
        ids = await asyncio.to_thread(_dispatch_siblings, session_id, ["a", "b"], [first, second])
        # One at a time: "a" arrives while "b" still runs, so its batch waits out the window.
        # (Had both arrived at once, nothing could join them: they would go home at once.)
        first.set()
        await _until(lambda: app.runner._batches.waiting(session_id) == 1)
        assert not model.wakes  # still in the window as the server begins to stop
        threading.Timer(0.5, second.set).start()  # "b" finishes while the server drains
    rows = [_row(i) for i in ids]
    assert [(r["delivery_state"], r["delivery_attempts"]) for r in rows] == [
        ("delivered", 1),
        ("delivered", 1),
    ]
    assert len(model.wakes) == 1 and len(bot.texts_to(42)) == 1
    assert sorted(_ids_in(model.wakes[0])) == sorted(ids)


async def test_a_drain_gives_a_stuck_wake_up_only_the_deliveries_grace(
    tmp_path: Path, bot: FakeBotApi
) -> None:
    """A wake-up that cannot finish (its turn hangs) gets the grace every delivery in flight
    gets at a stop, not the whole drain: the server stops, and the row stays pending for
    the restart to offer again."""
    model = GatedModel()
    model.hold.set()
    served = _served(tmp_path, bot, model, grace=0.5, coalesce_seconds=0.0, drain_seconds=60.0)
    try:
        async with served as (_app, session_id):
            gate = threading.Event()
            [row_id] = await asyncio.to_thread(_dispatch_siblings, session_id, ["a"], gate)
            gate.set()
            await _until(lambda: len(model.wakes) == 1)  # its wake-up turn hangs
            began = time.monotonic()
        # Far below the drain's 60 s: the delivery had its 0.5 s (and the turn its own).
        assert time.monotonic() - began < 30
        assert _row(row_id)["delivery_state"] == "pending"
    finally:
        model.released.set()
