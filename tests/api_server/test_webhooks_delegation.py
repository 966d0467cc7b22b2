"""A background delegation of an API-server session also sends a signed
``reveille.delegation.completed`` webhook (data.id = the delegation id), from a real
``serve`` to a real receiver on loopback; a server with endpoints but no secret refuses to
start."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from agent.providers.demo import DemoModel
from gateway.wake import DELEGATION_DISPLAY_KIND
from gateway.webhooks import DELEGATION_COMPLETED, delivery_id_for, new_secret
from reveille.app import serve
from reveille.settings import Settings, SettingsError
from tests.gateway.webhook_receiver import WebhookReceiver
from tools.async_delegation import reset_runtime
from tools.process_registry import process_registry

from ._support import DEMO_DELAY, KEY, RecordingProvider, client_for, poll
from .test_runner import HEADER, messages, user

SECRET = new_secret()


@pytest.fixture
def clean_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    process_registry.completion_queue.drain()
    yield
    reset_runtime()
    process_registry.completion_queue.drain()


def settings_for(home: Path, *urls: str, secret: str = SECRET) -> Settings:
    return Settings(
        home=home,
        port=0,
        webui_port=0,
        api_key=KEY,
        demo_delay_seconds=DEMO_DELAY,
        webhook_urls=",".join(urls),
        webhook_secret=secret,
    )


async def test_a_delegation_result_of_an_api_session_sends_a_webhook(
    tmp_path: Path, clean_state: None
) -> None:
    receiver = WebhookReceiver()
    await receiver.start()
    provider = RecordingProvider(DemoModel(delay_seconds=DEMO_DELAY))
    try:
        async with serve(settings_for(tmp_path, receiver.url), provider=provider) as app:
            assert app.webhooks is not None
            port = app.adapter.port
            raw = await client_for(port).chat.completions.with_raw_response.create(
                model="reveille-demo", messages=user("in the background: summarise the Q3 report")
            )
            session_id = raw.headers[HEADER]

            async def delivered() -> list[dict]:
                rows = await messages(port, session_id)
                return [r for r in rows if r["display_kind"] == DELEGATION_DISPLAY_KIND]

            (row,) = await poll(delivered)
            deleg_id = row["display_metadata"]["delegation_id"]
            await receiver.wait_for(1)
            webhook_id = delivery_id_for(DELEGATION_COMPLETED, deleg_id)
            await poll(lambda: app.webhooks.backend.deliveries(webhook_id)[0].state == "delivered")
    finally:
        await receiver.stop()
    (got,) = receiver.received
    client = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")
    client.webhooks.unwrap(got.body, got.headers, secret=SECRET)
    payload = json.loads(got.body)
    assert payload["type"] == DELEGATION_COMPLETED
    assert payload["data"] == {"id": deleg_id}
    assert payload["id"] == got.headers["webhook-id"] == webhook_id


async def test_endpoints_without_any_secret_stop_the_start(
    tmp_path: Path, clean_state: None
) -> None:
    settings = settings_for(tmp_path, "http://127.0.0.1:9/hook", secret="")
    with pytest.raises(SettingsError, match="reveille webhooks secret"):
        async with serve(settings, provider=DemoModel(delay_seconds=0)):
            pass
