"""``POST /v1/responses/compact`` and ``/v1/responses/input_tokens`` with the official client.

A real server on loopback over the demo model (``RecordingProvider`` shows what the
summariser was asked); every answer is validated against the ``openai`` pydantic types.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.responses import CompactedResponse, InputTokenCountResponse

from agent.markers import SUMMARISE_MARKER, SUMMARY_MARKER
from gateway.responses import ResponsesService
from gateway.session import SessionStore
from gateway.surfaces.api_server.adapter import ApiServerAdapter
from gateway.turns.compaction import (
    CompactionPolicy,
    Compactor,
    estimate_tokens,
    provider_summariser,
)
from tests.api_server._support import KEY, RecordingProvider, client_for
from tests.api_server.test_conversations_api import server


@contextlib.asynccontextmanager
async def compacting(
    store: SessionStore, directory: Path, **kwargs: Any
) -> AsyncIterator[tuple[ApiServerAdapter, ResponsesService, RecordingProvider]]:
    async with server(store, directory, **kwargs) as (adapter, service, provider):
        # What the composition root gives the API server's turn service (reveille.surfaces).
        adapter.turns.compactor = Compactor(
            store, provider_summariser(provider), CompactionPolicy()
        )
        yield adapter, service, provider


def _summariser_prompt(provider: RecordingProvider) -> str:
    asked = [c for c in provider.contexts if SUMMARISE_MARKER in str(c[0].get("content"))]
    assert asked, "the summariser was never called"
    return str(asked[-1][-1]["content"])


async def test_compact_input_answers_one_compaction_item(store, tmp_path) -> None:
    async with compacting(store, tmp_path) as (adapter, _, provider):
        client = client_for(adapter.port)
        raw = await client.responses.with_raw_response.compact(
            model=provider.name,
            input=[
                {"role": "user", "content": "my cat is called Biscuit"},
                {"role": "assistant", "content": "noted"},
            ],
        )
        compacted = CompactedResponse.model_validate(raw.http_response.json())
        assert compacted.object == "response.compaction"
        [item] = compacted.output
        assert item.type == "compaction" and item.id.startswith("cmp_")
        assert item.encrypted_content.startswith(SUMMARY_MARKER)
        assert "Biscuit" in _summariser_prompt(provider)
        assert compacted.usage.total_tokens == (
            compacted.usage.input_tokens + compacted.usage.output_tokens
        )


async def test_compact_previous_response_then_continue_from_the_item(store, tmp_path) -> None:
    async with compacting(store, tmp_path) as (adapter, service, provider):
        client = client_for(adapter.port)
        first = await client.responses.create(
            model=provider.name, input="the password is swordfish"
        )
        compacted = await client.responses.compact(
            model=provider.name, previous_response_id=first.id
        )
        assert "swordfish" in _summariser_prompt(provider)
        row = await service.get(first.id)
        assert row is not None
        # Nothing stored changed: compacting is the client's choice to use.
        assert not any(m.archived for m in store.messages(row.session_id))

        item = compacted.output[0]
        assert item.type == "compaction"
        nxt = await client.responses.create(
            model=provider.name,
            input=[
                {"type": "compaction", "id": item.id, "encrypted_content": item.encrypted_content},
                {"role": "user", "content": "what now?"},
            ],
        )
        assert nxt.status == "completed"
        context = provider.contexts[-1]
        assert any(
            m["role"] == "system" and m["content"] == item.encrypted_content for m in context
        )


async def test_input_tokens_counts_the_transcript_and_the_input(store, tmp_path) -> None:
    async with compacting(store, tmp_path) as (adapter, service, provider):
        client = client_for(adapter.port)
        raw = await client.responses.input_tokens.with_raw_response.count(input="x" * 400)
        counted = InputTokenCountResponse.model_validate(raw.http_response.json())
        assert counted.object == "response.input_tokens"
        assert counted.input_tokens == estimate_tokens([{"role": "user", "content": "x" * 400}])

        first = await client.responses.create(model=provider.name, input="hello there")
        row = await service.get(first.id)
        assert row is not None
        rows = [m.as_dict() for m in store.messages(row.session_id)]
        more = await client.responses.input_tokens.count(
            previous_response_id=first.id, input="and then?"
        )
        assert more.input_tokens == estimate_tokens(
            [*rows, {"role": "user", "content": "and then?"}]
        )


async def test_refusals(store, tmp_path) -> None:
    async with compacting(store, tmp_path, api_key="") as (adapter, _, provider):
        alice, bob = client_for(adapter.port, "alice"), client_for(adapter.port, "bob")
        mine = await alice.responses.create(model=provider.name, input="private")
        # Another owner key, a forged id, a malformed one: as if it did not exist.
        for previous in (mine.id, "resp_" + "0" * 32, "nonsense"):
            with pytest.raises(openai.NotFoundError):
                await bob.responses.compact(model=provider.name, previous_response_id=previous)
            with pytest.raises(openai.NotFoundError):
                await bob.responses.input_tokens.count(previous_response_id=previous)
        assert (await alice.responses.input_tokens.count(previous_response_id=mine.id)).input_tokens
        with pytest.raises(openai.BadRequestError) as both:
            await alice.responses.input_tokens.count(
                previous_response_id=mine.id, conversation="conv_1", input="x"
            )
        assert both.value.code == "invalid_value"
        with pytest.raises(openai.BadRequestError):
            await alice.responses.compact(model=provider.name)  # nothing to compact
        with pytest.raises(openai.BadRequestError):
            await alice.responses.compact(model=provider.name, input=[{"role": "x"}])  # type: ignore[list-item]
        url = f"http://127.0.0.1:{adapter.port}/v1/responses/input_tokens"
        async with aiohttp.ClientSession() as http:
            for payload in (b'{"input": "\\ud800"}', b"[1]", b"{not json"):
                async with http.post(
                    url,
                    data=payload,
                    headers={"Authorization": "Bearer alice", "Content-Type": "application/json"},
                ) as response:
                    assert response.status == 400
                    assert (await response.json())["error"]["message"]


async def test_compact_needs_the_key(store, tmp_path) -> None:
    async with compacting(store, tmp_path) as (adapter, _, provider):
        with pytest.raises(openai.AuthenticationError):
            await client_for(adapter.port, "wrong").responses.compact(
                model=provider.name, input="hi"
            )
        assert KEY  # the right one works (the other tests)
