"""Two conversations that open alike never share a session, nor one another's results."""

from __future__ import annotations

import asyncio

import openai
import pytest

from agent.markers import DELIVERY_MARKER
from agent.providers.demo import DemoModel
from delivery.rows import RowQuery
from delivery.session_backend import MessageRecord
from gateway.session import SessionGone
from gateway.surfaces.api_server.adapter import ApiServerAdapter, agent_turn_runner
from gateway.turns.conversation import derive_session_id, pick_session
from gateway.wake import persist_delegation_delivery
from tests.api_server._support import client_for, demo_agent, running_adapter
from tests.stores import session_file_store
from tools.async_delegation import get_runtime

HEADER = "X-Hermes-Session-Id"
OPENING = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "hi"},
]
RESULT = {
    "type": "async_delegation",
    "delegation_id": "deleg_alice",
    "goal": "look up alice's balance",
    "status": "completed",
    "summary": "Alice has 1,234 credits.",
}


async def _ask(client, messages):
    raw = await client.chat.completions.with_raw_response.create(
        model="reveille-demo", messages=messages
    )
    return raw.headers[HEADER], raw.parse().choices[0].message.content


async def test_same_opening_different_conversations(store) -> None:
    async with running_adapter(store, api_key="") as (adapter, provider, _runner):
        client = client_for(adapter.port, key=None)
        alice, a1 = await _ask(client, OPENING)
        alice_history = [*OPENING, {"role": "assistant", "content": a1}]
        same, a2 = await _ask(client, [*alice_history, {"role": "user", "content": "check it"}])
        assert same == alice
        alice_history += [
            {"role": "user", "content": "check it"},
            {"role": "assistant", "content": a2},
        ]
        # Alice's background result lands in her session while she is away.
        await asyncio.to_thread(persist_delegation_delivery, store, alice, RESULT)

        bob, b1 = await _ask(client, OPENING)  # Bob opens exactly like Alice did
        assert bob != alice
        assert "1,234" not in _context(provider) and DELIVERY_MARKER not in _context(provider)
        same_b, _ = await _ask(
            client,
            [*OPENING, {"role": "assistant", "content": b1}, {"role": "user", "content": "so?"}],
        )
        assert same_b == bob
        assert "1,234" not in _context(provider)
        assert "1,234" not in " ".join(m.content for m in store.messages(bob))

        # Alice comes back with the history she was shown: her session, her result.
        same_a, _ = await _ask(client, [*alice_history, {"role": "user", "content": "and?"}])
        assert same_a == alice
        assert "1,234" in _context(provider)


def _context(provider) -> str:
    return "\n".join(m["content"] for m in provider.contexts[-1])


async def test_a_history_that_matches_no_session_gets_its_own(store) -> None:
    async with running_adapter(store, api_key="") as (adapter, _provider, _runner):
        client = client_for(adapter.port, key=None)
        first, _ = await _ask(client, OPENING)
        forged = [
            *OPENING,
            {"role": "assistant", "content": "something never said"},
            {"role": "user", "content": "more"},
        ]
        other, _ = await _ask(client, forged)
        assert other != first and other.startswith(first + "_")
        assert [m.role for m in store.messages(first)] == ["user", "assistant"]


async def test_a_deleted_conversation_that_comes_back_starts_afresh(store) -> None:
    """The one read that picks a new conversation's session also sees the opening's
    tombstone: the comeback is created again explicitly and adopts no late result."""
    async with running_adapter(store, api_key="") as (adapter, provider, _runner):
        client = client_for(adapter.port, key=None)
        first, _ = await _ask(client, OPENING)
        assert store.delete_session(first)
        # A result of the deleted conversation arrives after the delete: refused.
        with pytest.raises(SessionGone):
            await asyncio.to_thread(persist_delegation_delivery, store, first, RESULT)
        again, _ = await _ask(client, OPENING)
        assert again == first and store.get_session(first) is not None
        assert [m.role for m in store.messages(first)] == ["user", "assistant"]
        assert "1,234" not in _context(provider)
        # A brand-new opening still gets its home id at once.
        fresh, _ = await _ask(client, [{"role": "user", "content": "a new opening"}])
        assert fresh.startswith("api_") and "_" not in fresh.removeprefix("api_")


async def _ask_keyed(client, messages, key):
    raw = await client.chat.completions.with_raw_response.create(
        model="reveille-demo", messages=messages, extra_headers={"Idempotency-Key": key}
    )
    return raw.headers[HEADER], raw.parse().choices[0].message.content


async def test_two_first_turns_that_open_alike_at_once_get_sessions_of_their_own(store) -> None:
    """Neither session exists in the store until its first turn is stored, so the second
    conversation is told apart while the first still runs, never merged into it."""
    async with running_adapter(store, api_key="", delay=0.3) as (adapter, _provider, runner):
        client = client_for(adapter.port, key=None)
        opening = [{"role": "user", "content": "same start"}]
        (a, _), (b, _) = await asyncio.gather(_ask(client, opening), _ask(client, opening))
        assert a != b and {a, b} & {derive_session_id(opening)}
        assert runner.max_running == 2
        for sid in (a, b):
            assert [m.role for m in store.messages(sid)] == ["user", "assistant"]
        # Keyed: a retry of the same request joins its first attempt (run once, answered
        # twice); another request's key is another conversation.
        opening = [{"role": "user", "content": "keyed start"}]
        calls = runner.calls
        (k1, r1), (k2, r2), (k3, _) = await asyncio.gather(
            _ask_keyed(client, opening, "key-1"),
            _ask_keyed(client, opening, "key-1"),
            _ask_keyed(client, opening, "key-2"),
        )
        assert k1 == k2 and r1 == r2 and k3 != k1
        assert runner.calls == calls + 2
        assert [m.role for m in store.messages(k1)] == ["user", "assistant"]
        assert [m.role for m in store.messages(k3)] == ["user", "assistant"]


async def test_a_first_turn_that_fails_leaves_its_id_to_the_next_conversation(store) -> None:
    demo = agent_turn_runner(demo_agent(DemoModel()))
    calls = []

    async def fails_first(messages, ctx, on_delta):
        calls.append(messages)
        if len(calls) == 1:
            raise RuntimeError("the model fell over")
        await asyncio.sleep(0.3)
        return await demo(messages, ctx, on_delta)

    adapter = ApiServerAdapter(
        store=store, turn_runner=fails_first, port=0, api_key="", max_concurrent_runs=1
    )
    await adapter.start()
    try:
        client = client_for(adapter.port, key=None)
        doomed = [{"role": "user", "content": "doomed start"}]
        with pytest.raises(openai.InternalServerError):  # failed while it ran
            await _ask(client, doomed)
        busy = [{"role": "user", "content": "busy start"}]
        slow = asyncio.create_task(_ask(client, [{"role": "user", "content": "slow"}]))
        await asyncio.sleep(0.1)
        with pytest.raises(openai.RateLimitError):  # refused before it ran
            await _ask(client, busy)
        await slow
        # Each opening still gets its own id: nothing was written, nothing stays reserved.
        for opening in (doomed, busy):
            sid, _ = await _ask(client, opening)
            assert sid == derive_session_id(opening)
    finally:
        await adapter.stop()


@pytest.mark.parametrize(
    ("stream", "text"),
    [
        (False, "same start, two servers"),
        (True, "same start, two servers"),
        (False, "in the background: count the stars"),  # the work's origin is written first
    ],
)
async def test_two_servers_never_merge_alike_first_turns(store, tmp_path, stream, text) -> None:
    """Two servers on one store cannot see each other's first turns while they run: the
    store refuses the second creation of the id, so the later turn is refused whole (409,
    nothing stored, no work started) and sent again it gets a session of its own."""
    with session_file_store(tmp_path / "sessions.db") as other_store:
        async with (
            # The two first turns must overlap: a slow model (2 s), so that a loaded machine
            # starting one request late still finds the other running (0.3 s did not).
            running_adapter(store, api_key="", delay=2.0) as (one, _p1, _r1),
            running_adapter(other_store, api_key="", delay=2.0) as (two, _p2, _r2),
        ):
            opening = [{"role": "user", "content": text}]
            clients = [client_for(a.port, key=None) for a in (one, two)]

            async def ask(client):
                raw = await client.chat.completions.with_raw_response.create(
                    model="reveille-demo", messages=opening, stream=stream
                )
                if stream:
                    async for _ in raw.parse():
                        pass
                return raw.headers[HEADER]

            # The delegation runtime is the process's: count only the work started here.
            earlier = _work_of(derive_session_id(opening))
            outcomes = await asyncio.gather(*(ask(c) for c in clients), return_exceptions=True)
            won = [o for o in outcomes if isinstance(o, str)]
            lost = [o for o in outcomes if not isinstance(o, str)]
            assert won == [derive_session_id(opening)] and len(lost) == 1
            assert isinstance(lost[0], openai.ConflictError)
            assert lost[0].code == "conversation_conflict"
            assert [m.role for m in store.messages(won[0])] == ["user", "assistant"]
            started = len(_work_of(won[0]) - earlier)
            assert started == (1 if text.startswith("in the background") else 0)
            again = await ask(clients[outcomes.index(lost[0])])
            assert again != won[0] and again.startswith(won[0] + "_")
            assert [m.role for m in store.messages(again)] == ["user", "assistant"]


def _work_of(session_id: str) -> set[str]:
    return {row.id for row in get_runtime().ledger.query(RowQuery(session=session_id))}


def test_an_empty_session_is_joined_only_by_a_retry() -> None:
    # A streamed first turn creates its session before it stores anything; another server
    # sharing the store then sees it live and empty. A new conversation that opens alike
    # must not join it (their turns would merge); a retry of that request (its key) does.
    opening = [{"role": "user", "content": "hello there"}]
    home = derive_session_id(opening)
    running = [(home, ())]
    forked = pick_session(opening, running)
    assert forked != home and forked.startswith(home + "_")
    assert pick_session(opening, running, retry_key=True) == home
    # A stored first turn is matched by its conversation's next request as before.
    reply = (
        MessageRecord(1, "user", "hello there", 0.0, None, None, False),
        MessageRecord(2, "assistant", "hi", 0.0, None, None, False),
    )
    follow_up = [*opening, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "?"}]
    assert pick_session(follow_up, [(home, reply)]) == home


async def test_a_conversation_is_named_after_its_first_message(store) -> None:
    async with running_adapter(store, api_key="") as (adapter, _provider, _runner):
        client = client_for(adapter.port, key=None)
        sid, reply = await _ask(
            client, [*OPENING[:1], {"role": "user", "content": "Plan <b>it</b>"}]
        )
        record = store.get_session(sid)
        assert record is not None and record.title == "Plan <b>it</b>"
        history = [
            *OPENING[:1],
            {"role": "user", "content": "Plan <b>it</b>"},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "and then?"},
        ]
        same, _ = await _ask(client, history)
        assert same == sid
        record = store.get_session(sid)
        assert record is not None and record.title == "Plan <b>it</b>"  # named once
        # A client that resends a history the server never stored: its first message.
        other, _ = await _ask(
            client,
            [
                {"role": "user", "content": "first thing\nmore"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "second thing"},
            ],
        )
        record = store.get_session(other)
        assert record is not None and record.title == "first thing"


async def test_a_new_conversations_first_turn_is_one_write_title_included(store) -> None:
    """The session, its title and the turn go in together: a new conversation's first
    turn costs the store one write (it used to title the session in a second one)."""
    async with running_adapter(store, api_key="") as (adapter, _provider, _runner):
        client = client_for(adapter.port, key=None)
        before = store._backend.stats()["writes"]  # type: ignore[attr-defined]
        sid, _ = await _ask(client, [{"role": "user", "content": "Name me\nnot this"}])
        assert store._backend.stats()["writes"] - before == 1  # type: ignore[attr-defined]
        record = store.get_session(sid)
        assert record is not None and record.title == "Name me"
