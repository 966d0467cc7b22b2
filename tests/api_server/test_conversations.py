"""Two conversations that open alike never share a session, nor one another's results."""

from __future__ import annotations

import asyncio

from agent.markers import DELIVERY_MARKER
from gateway.wake import persist_delegation_delivery
from tests.api_server._support import client_for, running_adapter

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
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages)
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
        assert "1,234" not in " ".join(m["content"] for m in store.messages(bob))

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
        assert [m["role"] for m in store.messages(first)] == ["user", "assistant"]
