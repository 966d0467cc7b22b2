"""The Response object says what was asked and what happened: echoed parameters, a cut
reported ``incomplete``, unknown parameters refused, a cancelled response keeping what it
streamed, the image detail reaching the model, no upstream address in an error, webhooks
for background responses only. A real server on loopback; the model is a fake
OpenAI-compatible upstream, driven with the official ``openai`` client.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from reveille.settings import load_settings
from tests.agent.test_openai_compat import FakeOpenAI
from tests.api_server._support import KEY, client_for, poll
from tests.api_server.test_openai_types import (
    Conformance,
    Held,
    _has_delta,
    broken_after,
    reply,
)
from tests.api_server.test_responses import serving, upstream


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


async def _post(port: int, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://127.0.0.1:{port}{path}", json=body, headers=headers) as answer,
    ):
        return answer.status, await answer.json()


async def test_the_response_echoes_what_was_asked_and_defaults_the_rest(
    store, tmp_path, fake
) -> None:
    fake.default = reply("ok")
    async with serving(store, tmp_path, upstream(fake)) as (adapter, _):
        client = client_for(adapter.port)
        plain = await client.responses.create(model="fake-model", input="hi")
        assert (plain.temperature, plain.top_p) == (1.0, 1.0)
        assert plain.truncation == "disabled" and plain.service_tier == "default"
        assert plain.top_logprobs == 0 and plain.reasoning is None and plain.conversation is None
        asked = await client.responses.create(
            model="fake-model",
            input="hi",
            temperature=0.3,
            top_p=0.9,
            truncation="auto",
            reasoning={"effort": "low", "summary": "concise"},
            max_tool_calls=3,
            service_tier="flex",
            safety_identifier="user-hash-1",
            prompt_cache_key="cache-1",
            prompt={"id": "pmpt_1", "version": "2", "variables": {"city": "Oslo"}},
            user="u-1",
            max_output_tokens=50,
            text={"format": {"type": "text"}, "verbosity": "low"},
            extra_body={"presence_penalty": 0.5, "frequency_penalty": -0.25},
        )
        check = Conformance()
        check.response(plain)
        check.response(asked)
        assert check.rejects == []
        data = asked.to_dict()
        assert (data["temperature"], data["top_p"]) == (0.3, 0.9)
        assert (data["presence_penalty"], data["frequency_penalty"]) == (0.5, -0.25)
        assert data["truncation"] == "auto"
        assert data["reasoning"] == {"effort": "low", "summary": "concise"}
        assert data["max_tool_calls"] == 3 and data["service_tier"] == "flex"
        assert data["safety_identifier"] == "user-hash-1"
        assert data["prompt_cache_key"] == "cache-1" and data["user"] == "u-1"
        assert data["prompt"] == {"id": "pmpt_1", "version": "2", "variables": {"city": "Oslo"}}
        assert data["max_output_tokens"] == 50
        assert data["text"] == {"format": {"type": "text"}, "verbosity": "low"}
        # The stored object says the same.
        assert (await client.responses.retrieve(asked.id)).to_dict() == data
        usage = data["usage"]
        assert usage["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}
        assert usage["output_tokens_details"] == {"reasoning_tokens": 0}


@pytest.mark.parametrize(
    ("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")]
)
async def test_a_cut_answer_is_incomplete_with_its_reason(
    store, tmp_path, fake, finish, reason
) -> None:
    fake.script = [reply("cut sh", finish=finish), reply("cut sh", finish=finish)]
    async with serving(store, tmp_path, upstream(fake)) as (adapter, _):
        client = client_for(adapter.port)
        cut = await client.responses.create(model="fake-model", input="long", max_output_tokens=5)
        assert cut.status == "incomplete"
        assert cut.incomplete_details is not None and cut.incomplete_details.reason == reason
        assert cut.output[0].status == "incomplete" and cut.output_text == "cut sh"
        stream = await client.responses.create(model="fake-model", input="long", stream=True)
        events = [event async for event in stream]
        assert events[-1].type == "response.incomplete"
        assert events[-1].response.incomplete_details.reason == reason


async def test_a_chat_completion_cut_by_length_says_length(store, tmp_path, fake) -> None:
    fake.script = [reply("cut", finish="length")]
    async with serving(store, tmp_path, upstream(fake)) as (adapter, _):
        client = client_for(adapter.port)
        answer = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "long"}]
        )
        assert answer.choices[0].finish_reason == "length"
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None


async def test_unknown_parameters_are_refused_by_name_and_real_clients_are_not(
    store, tmp_path, fake
) -> None:
    fake.default = reply("ok")
    async with serving(store, tmp_path, upstream(fake)) as (adapter, _):
        port = adapter.port
        status, body = await _post(
            port, "/v1/responses", {"model": "fake-model", "input": "hi", "frobnicate": 1}
        )
        assert status == 400 and body["error"]["code"] == "unknown_parameter"
        assert body["error"]["param"] == "frobnicate"
        status, body = await _post(
            port,
            "/v1/chat/completions",
            {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "frob": 1},
        )
        assert status == 400 and body["error"]["code"] == "unknown_parameter"
        assert body["error"]["param"] == "frob"
        status, body = await _post(
            port,
            "/v1/responses",
            {"model": "fake-model", "input": "hi", "context_management": [{"type": "x"}]},
        )
        assert status == 400 and body["error"]["code"] == "unsupported_parameter"
        assert "not supported" in body["error"]["message"]
        status, body = await _post(
            port, "/v1/responses", {"model": "fake-model", "input": "hi", "top_logprobs": 3}
        )
        assert status == 400 and body["error"]["code"] == "unsupported_value"
        for unsupported, value in (("audio", {"voice": "alloy"}), ("logprobs", True)):
            status, body = await _post(
                port,
                "/v1/chat/completions",
                {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
                | {unsupported: value},
            )
            assert status == 400 and body["error"]["code"] == "unsupported_parameter"
            assert body["error"]["param"] == unsupported
        # What Open WebUI, LibreChat and the openai client send is taken.
        client = client_for(port)
        answer = await client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "hi"}],
            user="u",
            metadata={"a": "b"},
            seed=1,
            n=1,
            logit_bias={"50256": -100},
            stream_options=None,
            presence_penalty=0.1,
            frequency_penalty=0.1,
            response_format={"type": "text"},
            store=False,
            logprobs=False,
            modalities=["text"],
            reasoning_effort="low",
        )
        assert answer.choices[0].message.content == "ok"
        made = await client.responses.create(
            model="fake-model",
            input="hi",
            include=["message.output_text.logprobs"],
            prompt_cache_retention="24h",
            stream_options=None,
        )
        assert made.status == "completed"


async def test_a_cancelled_response_keeps_what_it_streamed(store, tmp_path, fake) -> None:
    held = Held()
    fake.script = [held]
    async with serving(store, tmp_path, upstream(fake)) as (adapter, service):
        client = client_for(adapter.port)
        made = await client.responses.create(model="fake-model", input="go", background=True)
        await held.started.wait()
        await poll(lambda: _has_delta(service, made.id))
        cancelled = await client.responses.cancel(made.id)
        held.release.set()
        for seen in (cancelled, await client.responses.retrieve(made.id)):
            assert seen.status == "cancelled"
            assert seen.output_text == "Hello" and seen.output[0].status == "incomplete"


async def test_a_failed_response_keeps_its_partial_message_incomplete_and_no_address(
    store, tmp_path, fake
) -> None:
    fake.script = [broken_after("Hel"), broken_after("Hel")]
    async with serving(store, tmp_path, upstream(fake)) as (adapter, _):
        client = client_for(adapter.port)
        failed = await client.responses.create(model="fake-model", input="x")
        assert failed.status == "failed" and failed.output[0].status == "incomplete"
        assert failed.output_text == "Hel"
        assert failed.error is not None and "10.9.8.7" not in failed.error.message
        assert fake.base_url not in failed.error.message
        status, body = await _post(
            adapter.port,
            "/v1/chat/completions",
            {"model": "fake-model", "messages": [{"role": "user", "content": "x"}]},
        )
        assert status == 502
        text = json.dumps(body)
        assert "10.9.8.7" not in text and fake.base_url.split("/v1")[0] not in text


async def test_a_replayed_stream_opens_in_progress_without_an_end(store, tmp_path, fake) -> None:
    fake.default = reply("once")
    async with serving(store, tmp_path, upstream(fake)) as (adapter, _):
        client = client_for(adapter.port)
        headers = {"Idempotency-Key": "again-1"}
        await client.responses.create(model="fake-model", input="x", extra_headers=headers)
        stream = await client.responses.create(
            model="fake-model", input="x", stream=True, extra_headers=headers
        )
        events = [event async for event in stream]
        for opening in events[:2]:
            assert opening.response.status == "in_progress"
            assert opening.response.completed_at is None and opening.response.usage is None
        assert events[-1].response.completed_at is not None


async def test_the_image_detail_reaches_the_model(store, tmp_path, fake) -> None:
    fake.default = reply("a heart")
    async with serving(store, tmp_path, upstream(fake)) as (adapter, _):
        client = client_for(adapter.port)
        image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}
        await client.responses.create(
            model="fake-model",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "?"}, image]}],
        )
        sent = fake.requests[-1]["body"]["messages"][-1]["content"]
        assert sent[1]["image_url"] == {"url": "data:image/png;base64,AAAA", "detail": "low"}


@pytest.mark.parametrize("foreground", [False, True])
async def test_webhooks_are_for_background_responses_unless_asked(
    store, tmp_path, fake, foreground
) -> None:
    fake.default = reply("ok")
    told: list[tuple[str, str]] = []
    options = {"hook_foreground": foreground}
    async with serving(
        store, tmp_path, upstream(fake), hook=lambda *a: told.append(a), service_options=options
    ) as (adapter, _):
        client = client_for(adapter.port)
        inline = await client.responses.create(model="fake-model", input="hi")
        queued = await client.responses.create(model="fake-model", input="hi", background=True)
        await poll(lambda: (queued.id, "response.completed") in told)
        expected = {(queued.id, "response.completed")}
        if foreground:
            expected.add((inline.id, "response.completed"))
        assert set(told) == expected


async def test_an_unknown_parameter_via_the_client_is_a_bad_request(store, tmp_path, fake) -> None:
    async with serving(store, tmp_path, upstream(fake)) as (adapter, _):
        client = client_for(adapter.port)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model="fake-model", input="hi", extra_body={"x_y": 1})
        assert caught.value.code == "unknown_parameter"


def test_webhooks_for_foreground_responses_is_a_setting(tmp_path) -> None:
    home = {"REVEILLE_HOME": str(tmp_path)}
    assert load_settings(home).webhook_foreground is False
    (tmp_path / "config.toml").write_text("[webhooks]\nforeground = true\n")
    assert load_settings(home).webhook_foreground is True
    assert (
        load_settings({**home, "REVEILLE_WEBHOOK_FOREGROUND": "false"}).webhook_foreground is False
    )


async def test_a_delta_stored_while_the_cancel_is_on_its_way_is_in_the_cancelled_object(
    store, tmp_path, fake
) -> None:
    held = Held()
    fake.script = [held]
    async with serving(store, tmp_path, upstream(fake)) as (adapter, service):
        client = client_for(adapter.port)
        made = await client.responses.create(model="fake-model", input="go", background=True)
        await held.started.wait()
        await poll(lambda: _has_delta(service, made.id))
        backend = service.store
        real = backend.transition

        def racing(response_id: str, **kwargs: Any) -> bool:
            # The runner stores one more delta just before the cancel moves the row.
            if kwargs["expect"] == ("in_progress",) and kwargs["change"].status == "cancelled":
                row = backend.get(response_id)
                first = backend.events_after(response_id, -1, 100)
                added = next(e for e in first if e.type == "response.output_item.added")
                item_id = json.loads(added.data)["item"]["id"]
                delta = {"item_id": item_id, "output_index": 0, "content_index": 0}
                delta |= {"delta": " there", "logprobs": []}
                event = ("response.output_text.delta", json.dumps(delta))
                assert backend.append_events(response_id, row.owner, [event])
            return real(response_id, **kwargs)

        backend.transition = racing
        cancelled = await client.responses.cancel(made.id)
        held.release.set()
        assert cancelled.status == "cancelled" and cancelled.output_text == "Hello there"
        assert (await client.responses.retrieve(made.id)).output_text == "Hello there"
