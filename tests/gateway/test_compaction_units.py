"""Compaction's parts: the provider's "context length exceeded" error, the demo model's
summary, the settings, the web UI's view of a compacted transcript, the turn lease a
compaction runs under, and the backstop with an unknown window."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from agent.loop import Agent
from agent.markers import SUMMARISE_MARKER, SUMMARY_MARKER
from agent.providers.base import ProviderError
from agent.providers.demo import DemoModel
from agent.tools import ToolRegistry
from api.views import transcript_items
from gateway.config import Platform
from gateway.session import SessionSource, SessionStore
from gateway.turns.compaction import (
    CompactionPolicy,
    Compactor,
    estimate_tokens,
    provider_summariser,
)
from gateway.turns.service import (
    StartedTurn,
    TurnError,
    TurnRequest,
    TurnService,
    agent_turn_runner,
)
from reveille.settings import SettingsError, load_settings
from tests.agent.test_openai_compat import FakeOpenAI, completion, provider_for
from tests.sessions._support import append_turn, make_session
from tests.stores import session_file_store

SID = "api_units"


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


def overflow(request: object = None, body: object = None) -> object:
    async def handler(request: web.Request, body: dict[str, object]) -> web.Response:
        error = {
            "message": "This model's maximum context length is 8192 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
        return web.json_response({"error": error}, status=400)

    return handler


async def test_context_length_exceeded_is_told_apart(fake: FakeOpenAI) -> None:
    fake.script = [overflow(), completion("x")]
    provider = provider_for(fake)
    with pytest.raises(ProviderError) as caught:
        await provider.complete([{"role": "user", "content": "hi"}])
    assert caught.value.context_overflow and caught.value.code == "context_length_exceeded"
    assert not ProviderError("HTTP 500: boom", status_code=500).context_overflow
    assert ProviderError("HTTP 400: prompt is too long", status_code=400).context_overflow
    assert not ProviderError("HTTP 400: bad temperature", status_code=400).context_overflow


async def test_the_demo_model_answers_a_summarisation_call() -> None:
    reply = await DemoModel(delay_seconds=0).complete(
        [
            {"role": "system", "content": f"{SUMMARISE_MARKER} summarise"},
            {"role": "user", "content": "user: plan the trip\n\nassistant: sure"},
        ]
    )
    assert reply.content and "plan the trip" in reply.content and not reply.tool_calls


def test_settings_window_and_cap(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        "[model]\ncontext_window = 32000\n[compaction]\nsummary_chars = 4000\n"
    )
    s = load_settings({"REVEILLE_HOME": str(tmp_path)})
    assert (s.context_window, s.compaction_summary_chars) == (32000, 4000)
    assert s.compaction_policy.context_window == 32000
    s = load_settings({"REVEILLE_HOME": str(tmp_path), "REVEILLE_CONTEXT_WINDOW": "0"})
    assert s.compaction_policy.context_window == 0
    with pytest.raises(SettingsError, match="context_window"):
        load_settings({"REVEILLE_HOME": str(tmp_path), "REVEILLE_CONTEXT_WINDOW": "12"})
    with pytest.raises(SettingsError, match="summary_chars"):
        load_settings({"REVEILLE_HOME": str(tmp_path), "REVEILLE_COMPACTION_SUMMARY_CHARS": "5"})


def test_estimate_is_characters_over_four() -> None:
    assert estimate_tokens([{"role": "user", "content": "x" * 400}]) == 104


def _store(tmp_path: Path) -> SessionStore:
    store = session_file_store(tmp_path / "sessions.db")
    make_session(store, SID, source=SessionSource(Platform.API_SERVER, chat_id=SID))
    for n in range(12):
        append_turn(
            store,
            SID,
            [
                {"role": "user", "content": f"question {n} " + "words " * 40},
                {"role": "assistant", "content": f"answer {n} " + "words " * 40},
            ],
        )
    return store


def _service(store: SessionStore, model: object, window: int) -> TurnService:
    provider = model
    return TurnService(
        store,
        agent_turn_runner(Agent(provider, ToolRegistry())),  # type: ignore[arg-type]
        render=lambda result: {"content": str(result.content or "")},
        compactor=Compactor(
            store,
            provider_summariser(provider),  # type: ignore[arg-type]
            CompactionPolicy(context_window=window, summary_chars=1000),
        ),
    )


async def _turn(service: TurnService, text: str, lease: str | None = None) -> dict[str, object]:
    started = await service.start(
        TurnRequest(SID, [{"role": "user", "content": text}], lease_stream_id=lease)
    )
    assert isinstance(started, StartedTurn)
    return await started.task


async def test_the_demo_app_compacts_and_the_web_ui_shows_it(tmp_path: Path) -> None:
    store = _store(tmp_path)
    service = _service(store, DemoModel(delay_seconds=0), 1000)
    await _turn(service, "hello again")
    assert service.compactor is not None and service.compactor.compactions == 1
    rows = store.messages(SID)
    summary = next(r for r in rows if r.display_metadata and "summary" in r.display_metadata)
    assert summary.content.startswith(SUMMARY_MARKER) and "Demo summary" in summary.content
    items = transcript_items(rows)
    marker = [i for i in items if i["kind"] == "summary"]
    assert marker == [
        {
            "kind": "summary",
            "id": f"m{summary.id}",
            "messages": 20,
            "deliveries": [],
            "archived": False,
        }
    ]
    archived = [i for i in items if i.get("archived")]
    assert len(archived) == 20 and archived[0]["content"].startswith("question 0")


async def test_the_window_is_judged_on_the_whole_history_not_the_bounded_context(
    tmp_path: Path,
) -> None:
    """A character bound smaller than the window must not hide how long the history grew:
    the older turns are summarised, not silently left out by the bound."""
    store = _store(tmp_path)
    service = _service(store, DemoModel(delay_seconds=0), 1000)
    service.context_chars = 2000  # about 500 tokens: under the 750 that trigger compaction
    await _turn(service, "hello again")
    assert service.compactor is not None and service.compactor.compactions == 1


async def test_compaction_runs_under_the_callers_lease_or_waits_for_a_busy_session(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    service = _service(store, DemoModel(delay_seconds=0), 1000)
    # Another turn holds the session: no compaction now, the turn still runs.
    assert store.take_turn(SID, "st_other").stream_id == "st_other"
    await _turn(service, "one")
    assert service.compactor is not None and service.compactor.compactions == 0
    # The web UI's turn holds the lease itself and passes it: the compaction runs under it.
    await _turn(service, "two", lease="st_other")
    assert service.compactor.compactions == 1
    assert store.running_turns()[SID].stream_id == "st_other"  # still the caller's
    store.end_turn(SID, "st_other")
    # Without a lease of its own the compaction takes the session and frees it after.
    append_turn(store, SID, [{"role": "user", "content": "w " * 2000}])
    await _turn(service, "three")
    assert service.compactor.compactions == 2
    assert SID not in store.running_turns()


async def test_the_backstop_compacts_and_retries_once_with_an_unknown_window(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    store = _store(tmp_path)
    service = _service(store, provider_for(fake), 0)
    fake.script = [overflow(), completion("the summary"), completion("answered")]
    answer = await _turn(service, "go on")
    assert answer["content"] == "answered"
    assert service.compactor is not None and service.compactor.compactions == 1
    sent = fake.requests[-1]["body"]["messages"]
    assert sent[0]["content"].startswith(SUMMARY_MARKER)
    assert len(sent) == 4  # summary, the newest exchange, the new message
    # Refused again after compacting: the turn fails (once), nothing stored.
    before = len(store.messages(SID))
    fake.script = [overflow(), completion("another summary"), overflow()]
    with pytest.raises(TurnError):
        await _turn(service, "and again")
    assert len([r for r in store.messages(SID) if r.role == "user"]) == len(
        [r for r in store.messages(SID)[:before] if r.role == "user"]
    )


async def test_a_summary_names_every_result_it_covers_and_stays_one(tmp_path: Path) -> None:
    store = session_file_store(tmp_path / "sessions.db")
    make_session(store, SID, source=SessionSource(Platform.API_SERVER, chat_id=SID))
    calls: list[list[dict[str, object]]] = []

    async def summarise(messages: list[dict[str, object]]) -> str:
        calls.append(messages)
        return "prose " * 100  # 600 characters each time: past the cap by the third

    compactor = Compactor(store, summarise, CompactionPolicy(context_window=0, summary_chars=1000))
    for round_ in range(3):
        for n in range(30):
            k = round_ * 30 + n
            store.append_message(
                SID,
                "system",
                f"result {k}",
                display_kind="async_delegation_complete",
                display_metadata={"delegation_id": f"deleg_{k:03d}", "goal": f"goal {k}"},
                dedupe_key=f"deleg:{k}",
            )
        taken = [m.id for m in (await store.abegin_turn(SID)).taken]
        append_turn(
            store,
            SID,
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            seen=taken,
        )
        history = [m.as_dict() for m in (await store.abegin_turn(SID)).history]
        assert await compactor.compact(SID, history, force=True) is not None
    live = [m for m in (await store.abegin_turn(SID)).history]
    summaries = [m for m in live if m.display_metadata and "summary" in m.display_metadata]
    assert len(summaries) == 1  # the earlier ones were rolled in (and archived)
    summary = summaries[0]
    meta = summary.display_metadata["summary"]
    assert [d["id"] for d in meta["deliveries"]] == [f"deleg_{k:03d}" for k in range(90)]
    assert all(f"deleg_{k:03d}" in summary.content for k in range(90))
    assert "goal 89" in summary.content and "goal 0\n" not in summary.content
    assert len(meta["body"]) <= 1000 and meta["body"].startswith("[... the oldest part")
    assert "[reveille:summary]" not in str(calls[-1][1]["content"])  # prose given, not redone
    store.close()
