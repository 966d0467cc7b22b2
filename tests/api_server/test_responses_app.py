"""The Responses API as ``reveille serve`` wires it (in process, the demo model): a real
background delegation started by one response comes home into that response's session and
is folded into the next response of the chain exactly once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import storage
import tools.async_delegation as ad
from agent.markers import DELIVERY_MARKER
from agent.providers.demo import DemoModel
from gateway.wake import DELEGATION_DISPLAY_KIND
from reveille.app import serve
from reveille.settings import Settings
from tests.api_server._support import KEY, RecordingProvider, client_for, poll
from tools.process_registry import process_registry


@pytest.fixture(autouse=True)
def _fresh_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    ad.reset_runtime()
    process_registry.completion_queue.drain()
    yield
    ad.reset_runtime()
    process_registry.completion_queue.drain()


async def test_a_delegation_started_by_a_response_is_folded_into_the_next_once(
    tmp_path: Path,
) -> None:
    settings = Settings(home=tmp_path, port=0, webui_port=0, api_key=KEY)
    provider = RecordingProvider(DemoModel(delay_seconds=0))
    async with serve(settings, provider=provider) as app:
        client = client_for(app.adapter.port)
        first = await client.responses.create(
            model=provider.name, input="in the background: count the stars", background=True
        )
        done = await poll(lambda: _completed(client, first.id))
        assert "background" in done.output_text.lower()
        responses = storage.sqlite_files(responses=tmp_path / "responses.db").open_responses()
        try:
            row = responses.get(first.id)
        finally:
            responses.close()
        assert row is not None
        session = row.session_id
        await poll(
            lambda: any(
                m.display_kind == DELEGATION_DISPLAY_KIND for m in app.store.messages(session)
            ),
            timeout=30,
        )

        second = await client.responses.create(
            model=provider.name, input="what came back?", previous_response_id=first.id
        )
        assert second.status == "completed"
        folded = provider.contexts[-1]
        assert folded[-2]["role"] == "system" and DELIVERY_MARKER in folded[-2]["content"]
        assert "count the stars" in folded[-2]["content"]

        third = await client.responses.create(
            model=provider.name, input="and now?", previous_response_id=second.id
        )
        assert third.status == "completed"
        deliveries = [
            m
            for m in provider.contexts[-1]
            if m["role"] == "system" and DELIVERY_MARKER in str(m["content"])
        ]
        assert len(deliveries) == 1  # in its place in the history, not delivered again
        assert provider.contexts[-1][-2] is not deliveries[0]


async def _completed(client, response_id: str):  # type: ignore[no-untyped-def]
    found = await client.responses.retrieve(response_id)
    return found if found.status == "completed" else None


def test_the_responses_settings_come_from_toml_and_the_environment(tmp_path: Path) -> None:
    from reveille.settings import SettingsError, load_settings

    config = tmp_path / "config.toml"
    config.write_text("[responses]\nkeep_days = 7\nlease_seconds = 12.5\n")
    settings = load_settings({"REVEILLE_HOME": str(tmp_path)}, config_file=config)
    assert settings.responses_keep_days == 7 and settings.responses_lease_seconds == 12.5
    env = {"REVEILLE_HOME": str(tmp_path), "REVEILLE_RESPONSES_KEEP_DAYS": "3"}
    from_env = load_settings(env, config_file=config)
    assert from_env.responses_keep_days == 3
    # One setting: retention's stored_responses kind reads [responses] keep_days.
    assert from_env.retention_policy.response_days == 3
    with pytest.raises(SettingsError, match="responses_keep_days"):
        load_settings({**env, "REVEILLE_RESPONSES_KEEP_DAYS": "-1"}, config_file=config)
    zero = {**env, "REVEILLE_RESPONSES_KEEP_DAYS": "0"}  # kept forever, as [retention] keys
    assert load_settings(zero, config_file=config).retention_policy.response_days == 0
    retention_key = tmp_path / "retention.toml"
    retention_key.write_text("[retention]\nresponse_days = 5\n")
    with pytest.raises(SettingsError, match="unknown setting"):
        load_settings({"REVEILLE_HOME": str(tmp_path)}, config_file=retention_key)
    with pytest.raises(SettingsError, match="responses_lease_seconds"):
        load_settings({**env, "REVEILLE_RESPONSES_LEASE_SECONDS": "0"}, config_file=config)
