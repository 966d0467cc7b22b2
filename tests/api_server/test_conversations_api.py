"""``/v1/conversations`` and ``conversation`` on ``/v1/responses``, with the official client.

A real server on loopback over the demo model (``RecordingProvider`` keeps each context the
model was given); the session store is each of the three backends. Every object the
server answers is validated against the ``openai`` pydantic types.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.conversations import (
    Conversation,
    ConversationDeletedResource,
    ConversationItemList,
    Message,
)
from openai.types.responses import Response

from agent.markers import DELIVERY_MARKER
from agent.providers.demo import DemoModel
from gateway.responses import ResponsesService
from gateway.session import SessionStore
from gateway.surfaces.api_server.adapter import ApiServerAdapter
from gateway.wake import persist_delegation_delivery
from tests.api_server._support import KEY, RecordingProvider, client_for, poll
from tests.api_server.test_responses import RESULT, serving
from tests.stores import memory_sessions, pg_sessions, session_file_store

validated = 0  # objects checked against the openai types (printed by the last test)


def _valid(model: Any, data: Any) -> Any:
    global validated
    validated += 1
    return model.model_validate(data)


@pytest.fixture(params=["sqlite", "memory", "postgres"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    if request.param == "sqlite":
        store = session_file_store(tmp_path / "sessions.db")
    elif request.param == "memory":
        store = SessionStore(memory_sessions())
    else:
        from tests.pg_support import fresh_url

        store = SessionStore(pg_sessions(fresh_url()))
    with store:
        yield store


@contextlib.asynccontextmanager
async def server(
    store: SessionStore, directory: Path, **kwargs: Any
) -> AsyncIterator[tuple[ApiServerAdapter, ResponsesService, RecordingProvider]]:
    provider = RecordingProvider(DemoModel(delay_seconds=0))
    async with serving(store, directory, provider, **kwargs) as (adapter, service):
        yield adapter, service, provider


async def test_conversation_lifecycle(any_store, tmp_path) -> None:
    async with server(any_store, tmp_path) as (adapter, _, _provider):
        client = client_for(adapter.port)
        created = await client.conversations.with_raw_response.create(
            metadata={"topic": "cats"},
            items=[{"type": "message", "role": "user", "content": "my cat is Biscuit"}],
        )
        conv = _valid(Conversation, created.http_response.json())
        assert conv.id.startswith("conv_") and conv.metadata == {"topic": "cats"}
        assert (await client.conversations.retrieve(conv.id)).metadata == {"topic": "cats"}

        updated = await client.conversations.update(conv.id, metadata={"topic": "dogs"})
        assert updated.metadata == {"topic": "dogs"}
        assert (await client.conversations.retrieve(conv.id)).metadata == {"topic": "dogs"}

        added = await client.conversations.items.with_raw_response.create(
            conv.id,
            items=[
                {"role": "assistant", "content": "noted"},
                {"role": "user", "content": "and a dog called Rex"},
            ],
        )
        page = _valid(ConversationItemList, added.http_response.json())
        assert [i.role for i in page.data] == ["assistant", "user"]  # type: ignore[union-attr]

        listed = _valid(
            ConversationItemList,
            (
                await client.conversations.items.with_raw_response.list(
                    conv.id, order="asc", limit=2
                )
            ).http_response.json(),
        )
        texts = [i.content[0].text for i in listed.data]  # type: ignore[union-attr]
        assert texts == ["my cat is Biscuit", "noted"] and listed.has_more
        rest = await client.conversations.items.list(
            conv.id, order="asc", after=listed.last_id, limit=10
        )
        assert [i.content[0].text for i in rest.data] == ["and a dog called Rex"]  # type: ignore[union-attr]
        newest = await client.conversations.items.list(conv.id, limit=1)
        assert newest.data[0].id == rest.data[0].id  # desc by default

        one = _valid(
            Message,
            (
                await client.conversations.items.with_raw_response.retrieve(
                    listed.first_id, conversation_id=conv.id
                )
            ).http_response.json(),
        )
        assert one.role == "user" and one.content[0].text == "my cat is Biscuit"  # type: ignore[union-attr]
        after_delete = await client.conversations.items.delete(
            listed.data[1].id, conversation_id=conv.id
        )
        assert after_delete.id == conv.id
        remaining = await client.conversations.items.list(conv.id, order="asc")
        assert len(remaining.data) == 2
        with pytest.raises(openai.NotFoundError):
            await client.conversations.items.retrieve(listed.data[1].id, conversation_id=conv.id)

        deleted = await client.conversations.with_raw_response.delete(conv.id)
        assert _valid(ConversationDeletedResource, deleted.http_response.json()).deleted
        with pytest.raises(openai.NotFoundError):
            await client.conversations.retrieve(conv.id)
        with pytest.raises(openai.NotFoundError):
            await client.conversations.items.list(conv.id)


async def test_responses_run_in_the_conversation_and_fold_a_background_result_once(
    store, tmp_path
) -> None:
    async with server(store, tmp_path) as (adapter, service, provider):
        client = client_for(adapter.port)
        conv = await client.conversations.create(
            items=[{"role": "user", "content": "remember: the code word is tangerine"}]
        )
        first = await client.responses.create(
            model=provider.name, input="what is the code word?", conversation=conv.id
        )
        assert first.status == "completed"
        assert first.conversation is not None and first.conversation.id == conv.id
        assert "tangerine" in "\n".join(str(m["content"]) for m in provider.contexts[-1])
        row = await service.get(first.id)
        assert row is not None and row.session_id == conv.id
        items = await client.conversations.items.list(conv.id, order="asc")
        assert [i.role for i in items.data] == ["user", "user", "assistant"]  # type: ignore[union-attr]

        # Background work of the conversation comes home to its session.
        await asyncio.to_thread(persist_delegation_delivery, store, conv.id, RESULT)
        second = await client.responses.create(
            model=provider.name,
            input="and?",
            conversation={"id": conv.id},
            background=True,
        )
        done = await poll(lambda: _completed(client, second.id))
        assert done.conversation.id == conv.id
        folded = [
            m
            for m in provider.contexts[-1]
            if m["role"] == "system" and DELIVERY_MARKER in str(m["content"])
        ]
        assert len(folded) == 1 and "1,234" in folded[0]["content"]

        await client.responses.create(model=provider.name, input="more?", conversation=conv.id)
        again = [
            m
            for m in provider.contexts[-1]
            if m["role"] == "system" and DELIVERY_MARKER in str(m["content"])
        ]
        # Once: in its place in the history, never a new delivery again.
        assert len(again) == 1 and provider.contexts[-1][-2] is not again[0]
        assert provider.contexts[-1][-2]["role"] != "system" or DELIVERY_MARKER not in str(
            provider.contexts[-1][-2]["content"]
        )

        counted = await client.responses.input_tokens.count(conversation=conv.id, input="x")
        assert counted.input_tokens > 10


async def _completed(client: openai.AsyncOpenAI, response_id: str) -> Any:
    found = await client.responses.retrieve(response_id)
    return found if found.status == "completed" else None


async def test_foreign_forged_and_malformed_ids(store, tmp_path) -> None:
    async with server(store, tmp_path, api_key="") as (adapter, _, provider):
        alice, bob = client_for(adapter.port, "alice"), client_for(adapter.port, "bob")
        mine = await alice.conversations.create(items=[{"role": "user", "content": "secret"}])
        item = (await alice.conversations.items.list(mine.id)).data[0]
        for conv_id in (mine.id, "conv_" + "0" * 32, "conv_nope", "sess_x"):
            for call in (
                bob.conversations.retrieve(conv_id),
                bob.conversations.update(conv_id, metadata={"a": "b"}),
                bob.conversations.delete(conv_id),
                bob.conversations.items.list(conv_id),
                bob.conversations.items.create(conv_id, items=[{"role": "user", "content": "x"}]),
                bob.conversations.items.retrieve(item.id, conversation_id=conv_id),
                bob.conversations.items.delete(item.id, conversation_id=conv_id),
                bob.responses.create(model=provider.name, input="hi", conversation=conv_id),
                bob.responses.input_tokens.count(conversation=conv_id, input="x"),
            ):
                with pytest.raises(openai.NotFoundError):
                    await call
        # Still alice's, untouched.
        assert len((await alice.conversations.items.list(mine.id)).data) == 1
        for item_id in ("msg_999999", "msg_0", "msg_x", "resp_1"):
            with pytest.raises(openai.NotFoundError):
                await alice.conversations.items.retrieve(item_id, conversation_id=mine.id)
        first = await alice.responses.create(model=provider.name, input="hi")
        with pytest.raises(openai.BadRequestError) as both:
            await alice.responses.create(
                model=provider.name,
                input="hi",
                conversation=mine.id,
                previous_response_id=first.id,
            )
        assert both.value.param == "conversation"


async def test_bad_input_is_refused_and_nothing_is_lost(store, tmp_path) -> None:
    async with server(store, tmp_path) as (adapter, _, _provider):
        client = client_for(adapter.port)
        conv = await client.conversations.create(metadata={"k": "v"})
        url = f"http://127.0.0.1:{adapter.port}/v1/conversations"
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        bad = [
            ("", b'{"metadata": {"k": "\\ud800"}}'),
            ("", b'{"metadata": {"k": 1}}'),
            ("", b'{"items": [{"role": "wizard", "content": "x"}]}'),
            ("", b'{"items": "no"}'),
            ("", b"[1]"),
            (f"/{conv.id}", b"{}"),  # update without metadata
            (f"/{conv.id}", b'{"metadata": {"' + b"k" * 65 + b'": "v"}}'),
            (f"/{conv.id}/items", b'{"items": []}'),
            (f"/{conv.id}/items", b'{"items": [{"role": "user", "content": "\\udfff"}]}'),
            (
                f"/{conv.id}/items",
                b'{"items": [' + b",".join([b'{"role":"user","content":"x"}'] * 21) + b"]}",
            ),
        ]
        async with aiohttp.ClientSession() as http:
            for path, payload in bad:
                async with http.post(url + path, data=payload, headers=headers) as response:
                    assert response.status == 400, (path, payload)
                    assert (await response.json())["error"]["message"]
            async with http.get(url + f"/{conv.id}/items?limit=0", headers=headers) as response:
                assert response.status == 400
            async with http.get(url + f"/{conv.id}/items?after=msg_1", headers=headers) as response:
                assert response.status == 400
            async with http.get(url + f"/{conv.id}", headers={}) as response:
                assert response.status == 401
        assert (await client.conversations.retrieve(conv.id)).metadata == {"k": "v"}
        assert (await client.conversations.items.list(conv.id)).data == []


async def test_a_v6_sessions_file_gains_the_metadata_column(tmp_path) -> None:
    path = tmp_path / "sessions.db"
    with session_file_store(path) as store:
        await store.acreate_session("conv_" + "a" * 32)
    raw = sqlite3.connect(path)
    raw.executescript("ALTER TABLE sessions DROP COLUMN metadata; PRAGMA user_version = 6;")
    raw.close()
    with session_file_store(path) as store:
        assert await store.aset_metadata("conv_" + "a" * 32, {"k": "v"})
        record = store.get_session("conv_" + "a" * 32)
        assert record is not None and record.metadata == {"k": "v"}
        assert await store.aset_metadata("conv_" + "a" * 32, None)
        assert store.get_session("conv_" + "a" * 32).metadata is None  # type: ignore[union-attr]


async def test_a_second_server_sees_the_conversation(store, tmp_path) -> None:
    async with (
        server(store, tmp_path) as (one, _, provider),
        server(store, tmp_path) as (two, _, _other),
    ):
        first, second = client_for(one.port), client_for(two.port)
        conv = await first.conversations.create(metadata={"where": "one"})
        raw = await second.responses.with_raw_response.create(
            model=provider.name, input="hello from two", conversation=conv.id
        )
        answered = _valid(Response, raw.http_response.json())
        assert answered.status == "completed" and answered.conversation.id == conv.id
        items = await first.conversations.items.list(conv.id, order="asc")
        assert [i.role for i in items.data] == ["user", "assistant"]  # type: ignore[union-attr]
        assert (await second.conversations.retrieve(conv.id)).metadata == {"where": "one"}
        print(f"validated {validated} objects against the openai types, 0 rejected")


class _CrashingRows:
    """The store's rows, failing when the first items are written: a crash mid-create."""

    def __init__(self, rows: Any) -> None:
        self._rows = rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rows, name)

    def insert_messages(self, *_: Any) -> None:
        raise RuntimeError("the disk went away while the items were written")

    insert_message = insert_messages


async def test_a_conversation_is_made_whole_or_not_at_all(any_store, tmp_path, monkeypatch) -> None:
    """One transaction on the durable backends (the memory one has no crash to survive:
    a crash loses the whole store, and its rules check before they write)."""
    if "memory" in any_store.url:
        pytest.skip("no transaction to roll back: a crash loses the memory store whole")
    tx = any_store._backend.tx
    real_awrite = tx.awrite

    def crashing(locks: Any, op: Any) -> Any:
        return real_awrite(locks, lambda rows: op(_CrashingRows(rows)))

    async with server(any_store, tmp_path) as (adapter, _, _provider):
        client = client_for(adapter.port)
        monkeypatch.setattr(tx, "awrite", crashing)
        with pytest.raises(openai.InternalServerError):
            await client.with_options(max_retries=0).conversations.create(
                metadata={"topic": "cats"},
                items=[{"type": "message", "role": "user", "content": "my cat is Biscuit"}],
            )
        monkeypatch.setattr(tx, "awrite", real_awrite)
        # Nothing of it is visible: no session without its metadata or items.
        assert any_store.list_sessions() == []
        made = await client.conversations.create(
            metadata={"topic": "cats"},
            items=[{"type": "message", "role": "user", "content": "my cat is Biscuit"}],
        )
        assert made.metadata == {"topic": "cats"}
        (item,) = (await client.conversations.items.list(made.id)).data
        assert item.content[0].text == "my cat is Biscuit"  # type: ignore[union-attr]
