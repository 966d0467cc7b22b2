"""Cancel wins: a cancel and the finished turn's store are ordered, never both.

The attack of issue 29 (item 5): a cancel that lands while the finished turn is being stored
left the response ``cancelled`` (output ``[]``) with its reply in the session, where a
``previous_response_id`` continuation showed it to the model. Here many cancels are timed
around the store of a turn whose model (``FakeOpenAI``) ends exactly when the test says:
before the end, at the end, while the store runs, just after it. Each race must end one
way only: ``cancelled`` with nothing stored, or ``completed`` with the reply stored once and
the cancel answered "completed" (already completed).

The session store is the real one; the test only watches its ``aappend_turn`` (a spy that
says when the store begins and holds it until the cancel is on its way, so "a cancel lands
while the turn is being stored" happens every time instead of by luck).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from gateway.session import SessionStore
from tests.agent.test_openai_compat import FakeOpenAI
from tests.api_server import test_responses
from tests.api_server._support import client_for, poll
from tests.api_server.test_responses import Gate, responses_backend, serving, upstream

fake = test_responses.fake  # the fake upstream's fixture, shared

RACES = int(os.environ.get("REVEILLE_CANCEL_RACES", "200"))
# How the cancel is timed against the store, one after the other.
TIMINGS = ("before_end", "at_end", "during_store", "after_store")


class StoreSpy:
    """Watches the session store's writes of a turn's reply: ``entered`` when one begins;
    it proceeds once ``proceed`` is set (the cancel of a ``during_store`` race is on its
    way). Other writes (a web UI message kept before its turn runs) pass unwatched."""

    def __init__(self, store: SessionStore) -> None:
        self._real = store.aappend_turn
        self.entered = asyncio.Event()
        self.done = asyncio.Event()
        self.proceed = asyncio.Event()
        self.proceed.set()
        store.aappend_turn = self._append  # type: ignore[method-assign]

    def arm(self, *, hold: bool) -> None:
        self.entered.clear()
        self.done.clear()
        if hold:
            self.proceed.clear()
        else:
            self.proceed.set()

    async def _append(self, session_id: str, messages: Any, **kwargs: Any) -> Any:
        if not any(m.get("role") == "assistant" for m in messages):
            return await self._real(session_id, messages, **kwargs)
        self.entered.set()
        await self.proceed.wait()
        try:
            return await self._real(session_id, messages, **kwargs)
        finally:
            self.done.set()


def _replies(store: SessionStore, session_id: str) -> list[str]:
    return [m.content for m in store.messages(session_id) if m.role == "assistant"]


async def test_a_cancel_timed_around_the_store_never_leaves_a_stored_reply(
    store: SessionStore, tmp_path: Any, fake: FakeOpenAI
) -> None:
    spy = StoreSpy(store)
    outcomes: dict[str, dict[str, int]] = {t: {"cancelled": 0, "completed": 0} for t in TIMINGS}
    cancelled_with_reply: list[str] = []
    async with serving(store, tmp_path, upstream(fake)) as (adapter, service):
        client = client_for(adapter.port)
        for i in range(RACES):
            timing = TIMINGS[i % len(TIMINGS)]
            gate = Gate()
            fake.script = [gate.handler()]
            spy.arm(hold=timing == "during_store")
            made = await client.responses.create(model="fake-model", input="race", background=True)
            await gate.started.wait()
            cancel: asyncio.Task[Any]
            if timing == "before_end":
                cancel = asyncio.create_task(client.responses.cancel(made.id))
                await asyncio.wait([cancel])  # answered: then the model ends
                gate.opened.set()
            elif timing == "at_end":
                # The model's end and the cancel race: the cancel is sent, and the model
                # ends a varying moment later (0-4 ms), while the cancel is on its way.
                cancel = asyncio.create_task(client.responses.cancel(made.id))
                await asyncio.sleep(0.0005 * (i % 9))
                gate.opened.set()
            elif timing == "during_store":
                gate.opened.set()
                await spy.entered.wait()
                cancel = asyncio.create_task(client.responses.cancel(made.id))
                # The cancel reaches the server while the store is held, then the store goes on.
                await asyncio.sleep(0.005 * (i % 5))
                spy.proceed.set()
            else:
                gate.opened.set()
                await spy.done.wait()
                cancel = asyncio.create_task(client.responses.cancel(made.id))
            answer = await cancel
            final = await poll(lambda made=made: _ended(client, made.id))
            row = await service.get(made.id)
            assert row is not None
            replies = _replies(store, row.session_id)
            assert answer.status == final.status, (timing, answer.status, final.status)
            outcomes[timing][final.status] += 1
            if final.status == "cancelled":
                # What it streamed stays, as an incomplete message: never a completed one.
                assert all(item.status == "incomplete" for item in final.output)
                if replies:
                    cancelled_with_reply.append(f"{timing}:{made.id}")
            else:
                assert final.status == "completed" and replies == ["Hello world"], (
                    timing,
                    final.status,
                    replies,
                )
        await poll(lambda: adapter.turns.background_runs == 0)
    cancelled = sum(o["cancelled"] for o in outcomes.values())
    print(
        f"\ncancel/store races: {RACES} ran, {cancelled} ended cancelled, "
        f"{cancelled - len(cancelled_with_reply)} of them without a stored reply, "
        f"{len(cancelled_with_reply)} with one; by timing: {outcomes}"
    )
    assert cancelled_with_reply == []
    # Both ways of winning were played: a cancel before the end, a store before the cancel.
    assert outcomes["before_end"]["cancelled"] > 0
    assert outcomes["after_store"]["completed"] > 0


async def _ended(client: Any, response_id: str) -> Any:
    found = await client.responses.retrieve(response_id)
    return found if found.status in ("cancelled", "completed", "failed") else None


async def test_a_shutdown_past_the_grace_while_the_reply_is_stored_ends_it_completed(
    store: SessionStore, tmp_path: Any, fake: FakeOpenAI
) -> None:
    """The store began: a shutdown that cancels the run then loses too; the response ends
    completed with its reply, never ``failed`` beside a reply in the session."""
    spy = StoreSpy(store)
    spy.arm(hold=True)
    gate = Gate()
    fake.script = [gate.handler()]
    async with serving(store, tmp_path, upstream(fake)) as (adapter, service):
        client = client_for(adapter.port)
        made = await client.responses.create(model="fake-model", input="race", background=True)
        await gate.started.wait()
        gate.opened.set()
        await spy.entered.wait()
        stopping = asyncio.create_task(service.stop(grace_seconds=0))
        await asyncio.sleep(0.05)  # the run is cancelled while its store is held
        spy.proceed.set()
        await stopping
    again = responses_backend("sqlite", tmp_path)
    try:
        row = again.get(made.id)
    finally:
        again.close()
    assert row is not None and row.status == "completed", row
    assert _replies(store, row.session_id) == ["Hello world"]
