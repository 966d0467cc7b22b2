"""Traces: a turn that starts background work, the work, and the wake-up that brings it back.

A real server (``reveille.app.serve``) with the demo model; spans go to the SDK's
``InMemorySpanExporter`` through a tracer provider installed for the test only, or over
OTLP/HTTP to a fake collector on loopback (``reveille.tracing``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util._once import Once

from agent.providers.demo import DemoModel
from delivery import traces
from delivery.rows import RowQuery
from reveille.app import serve
from reveille.settings import Settings, SettingsError, load_settings
from tests.api_server._support import client_for, poll
from tests.pg_support import fresh_url
from tests.webui.conftest import settings_for as webui_settings
from tests.webui.conftest import start_web, stop_web
from tools.async_delegation import (
    configure_runtime,
    dispatch_async_delegation,
    get_durable_delegation,
    get_runtime,
    reset_runtime,
)
from tools.process_registry import process_registry

GOAL = "count the sheep in the secret meadow"


def _reset_trace_globals() -> None:
    # The API lets a process set its tracer provider once; a test needs its own and must
    # leave none behind (what opentelemetry-test-utils does too).
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _reset_trace_globals()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()
    _reset_trace_globals()


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    process_registry.completion_queue.drain()
    yield tmp_path
    reset_runtime()
    process_registry.completion_queue.drain()


def settings_for(home: Path, **extra: Any) -> Settings:
    return Settings(home=home, port=0, webui_port=0, demo_delay_seconds=0, **extra)


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def delivered(exporter: InMemorySpanExporter) -> ReadableSpan | None:
    done = [
        s
        for s in named(exporter, "reveille.delivery")
        if (s.attributes or {}).get("reveille.outcome") == "delivered"
    ]
    return done[0] if done else None


async def one_turn(port: int, text: str) -> str:
    raw = await client_for(port, key=None).chat.completions.with_raw_response.create(
        model="reveille-demo", messages=[{"role": "user", "content": text}]
    )
    return raw.headers["X-Hermes-Session-Id"]


def attribute_values(exporter: InMemorySpanExporter) -> list[str]:
    return [str(v) for s in exporter.get_finished_spans() for v in (s.attributes or {}).values()]


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str:
    """The store the traceparent is kept in with the work: "" (SQLite files) or a fresh
    PostgreSQL schema."""
    return "" if request.param == "sqlite" else fresh_url()


async def test_a_wake_up_is_linked_to_the_turn_that_started_its_work(
    state: Path, spans: InMemorySpanExporter, database_url: str
) -> None:
    settings = settings_for(state, database_url=database_url)
    async with serve(settings, provider=DemoModel(delay_seconds=0)) as app:
        session = await one_turn(app.adapter.port, f"in the background: {GOAL}")
        delivery = await poll(lambda: delivered(spans))
        row = get_durable_delegation(str(delivery.attributes["reveille.delivery_id"]))

    [turn] = [
        s for s in named(spans, "reveille.turn") if s.attributes["reveille.session_id"] == session
    ]
    assert turn.attributes["reveille.outcome"] == "stored"
    assert turn.attributes["reveille.wakeup"] is False

    [tool] = named(spans, "reveille.tool")
    assert tool.attributes["reveille.tool"] == "delegate_task"
    assert tool.attributes["reveille.outcome"] == "ok"
    assert tool.parent is not None and tool.parent.span_id == turn.context.span_id

    [unit] = named(spans, "reveille.background.delegation")
    delegation_id = unit.attributes["reveille.delivery_id"]
    assert unit.attributes["reveille.outcome"] == "completed"
    assert unit.context.trace_id == turn.context.trace_id  # the turn's child
    assert unit.parent is not None and unit.parent.span_id == turn.context.span_id

    # The delivery runs later, in a trace of its own, and links back to the turn.
    assert delivery.attributes["reveille.delivery_id"] == delegation_id
    assert delivery.attributes["reveille.session_id"] == session
    assert delivery.context.trace_id != turn.context.trace_id
    [link] = delivery.links
    assert link.context.trace_id == turn.context.trace_id
    assert link.context.span_id == turn.context.span_id

    # The traceparent is stored with the result (so a re-offer after a restart links too),
    # and is not part of the runner's result.
    assert row is not None
    assert row["event"][traces.TRACEPARENT].split("-")[1] == f"{turn.context.trace_id:032x}"
    assert traces.TRACEPARENT not in row["result"]

    # Identifiers and outcomes only: nothing that was said.
    assert not any("sheep" in value for value in attribute_values(spans))


async def test_a_background_process_is_traced_and_its_delivery_linked(
    state: Path, spans: InMemorySpanExporter
) -> None:
    settings = settings_for(
        state, shell_enabled=True, shell_approvals="never", shell_workdir=str(state)
    )
    async with serve(settings, provider=DemoModel(delay_seconds=0)) as app:
        await one_turn(app.adapter.port, "run in the background: echo secret-words")
        delivery = await poll(lambda: delivered(spans))

    # The first turn, and the wake-up turn the process's result self-posted.
    [turn] = [s for s in named(spans, "reveille.turn") if not s.attributes["reveille.wakeup"]]
    [unit] = named(spans, "reveille.background.process")
    assert unit.attributes["reveille.outcome"] == "completed"
    assert unit.parent is not None and unit.parent.span_id == turn.context.span_id
    assert delivery.attributes["reveille.delivery_id"] == unit.attributes["reveille.delivery_id"]
    assert [link.context.span_id for link in delivery.links] == [turn.context.span_id]
    # The self-posted wake-up turn carried the delivery's traceparent: it is its child.
    [wake] = [s for s in named(spans, "reveille.turn") if s.attributes["reveille.wakeup"]]
    assert wake.parent is not None and wake.parent.span_id == delivery.context.span_id
    assert not any("secret-words" in value for value in attribute_values(spans))


async def test_a_web_ui_wake_up_turn_is_a_child_of_its_delivery(
    state: Path, spans: InMemorySpanExporter
) -> None:
    web = await start_web(webui_settings(state))
    try:
        session = await web.new_session()
        await web.say(session, f"in the background: {GOAL}")

        def wake_turn() -> tuple[ReadableSpan, ReadableSpan] | None:
            deliveries = {s.context.span_id: s for s in named(spans, "reveille.delivery")}
            for turn in named(spans, "reveille.turn"):
                if turn.parent is not None and turn.parent.span_id in deliveries:
                    return turn, deliveries[turn.parent.span_id]
            return None

        wake, delivery = await poll(wake_turn)
    finally:
        await stop_web(web)
    [first] = [s for s in named(spans, "reveille.turn") if s is not wake and s.parent is None]
    assert first.attributes["reveille.session_id"] == session
    assert wake.attributes["reveille.session_id"] == session
    assert wake.context.trace_id == delivery.context.trace_id != first.context.trace_id
    assert [link.context.span_id for link in delivery.links] == [first.context.span_id]


async def test_the_link_survives_a_restart(state: Path, spans: InMemorySpanExporter) -> None:
    # A turn of a server that stopped before its work's result was delivered.
    with trace.get_tracer("test").start_as_current_span("turn of the stopped server") as turn:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
    configure_runtime(str(state / "ledger.db"))
    ledger = get_runtime().ledger
    event = {
        "type": "completion",
        "delivery_id": "proc_0123456789abcdef",
        "session_key": "agent:main:api_server:dm:gone",
        "status": "completed",
        "exit_code": 0,
        "dispatched_at": time.time(),
        traces.TRACEPARENT: carrier["traceparent"],
    }
    ledger.create(event["delivery_id"], kind="process", state="running", request=event, goal="x")
    assert ledger.finish(event["delivery_id"], expected="running", state="completed", event=event)
    reset_runtime()

    async with serve(settings_for(state), provider=DemoModel(delay_seconds=0)):
        delivery = await poll(
            lambda: next(
                (
                    s
                    for s in named(spans, "reveille.delivery")
                    if s.attributes["reveille.delivery_id"] == event["delivery_id"]
                ),
                None,
            )
        )
    assert [link.context.span_id for link in delivery.links] == [turn.get_span_context().span_id]


async def test_a_clients_traceparent_does_not_parent_its_turn(
    state: Path, spans: InMemorySpanExporter
) -> None:
    # Only the server's own wake-ups (proven by the wake token) continue a trace.
    foreign = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with serve(settings_for(state), provider=DemoModel(delay_seconds=0)) as app:
        await client_for(app.adapter.port, key=None).chat.completions.create(
            model="reveille-demo",
            messages=[{"role": "user", "content": "hello"}],
            extra_headers={"traceparent": foreign},
        )
    [turn] = named(spans, "reveille.turn")
    assert turn.parent is None
    assert f"{turn.context.trace_id:032x}" != foreign.split("-")[1]


async def test_work_interrupted_by_a_drain_ends_its_span_interrupted(
    state: Path, spans: InMemorySpanExporter
) -> None:
    runtime = configure_runtime(str(state / "ledger.db"))
    release = threading.Event()

    async def turn() -> str:
        dispatched = await asyncio.to_thread(
            dispatch_async_delegation, goal=GOAL, runner=lambda: release.wait(30) and {}
        )
        return str(dispatched["delegation_id"])

    try:
        delegation_id = await traces.traced_turn(
            turn(), session_id="s", platform="api_server", wakeup=False
        )
        assert await asyncio.to_thread(runtime.drain, 0.05) == (0, [delegation_id])
    finally:
        release.set()
    # The worker's late return is not a second outcome of the unit.
    await poll(lambda: runtime.running_count() == 0)
    [first] = named(spans, "reveille.turn")
    [unit] = named(spans, "reveille.background.delegation")
    assert unit.attributes["reveille.delivery_id"] == delegation_id
    assert unit.attributes["reveille.outcome"] == "interrupted"
    assert unit.parent is not None and unit.parent.span_id == first.context.span_id


def test_a_stored_traceparent_that_is_malformed_or_absent_links_nothing(
    spans: InMemorySpanExporter,
) -> None:
    for event in ({}, {"traceparent": "garbage"}, {"traceparent": 7}, "not an event"):
        with traces.delivery_span(event):
            traces.note_outcome("dropped")
    finished = named(spans, "reveille.delivery")
    assert len(finished) == 4
    assert all(not s.links for s in finished)
    assert all(not s.status.is_ok for s in finished)  # a dropped delivery is an error


async def test_without_an_sdk_nothing_is_carried(state: Path) -> None:
    _reset_trace_globals()  # no provider: the API's no-op
    async with serve(settings_for(state), provider=DemoModel(delay_seconds=0)) as app:
        await one_turn(app.adapter.port, f"in the background: {GOAL}")
        row = await poll(lambda: _delivered_delegation(app))
    assert traces.TRACEPARENT not in row.event
    assert traces.TRACEPARENT not in (row.request or {})


def _delivered_delegation(app: Any) -> Any:
    rows = app.runtime.ledger.query(RowQuery(kind="delegation", limit=5))
    return next((r for r in rows if r.delivery_state == "delivered"), None)


@pytest.fixture
async def collector() -> Any:
    """A fake OTLP/HTTP collector on loopback: what it was sent, by path."""
    received: list[tuple[str, str, bytes]] = []

    async def collect(request: web.Request) -> web.Response:
        received.append((request.path, request.content_type, await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/{tail:.*}", collect)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", received
    await runner.cleanup()


async def test_an_otlp_endpoint_sends_the_spans_to_the_collector(
    state: Path, collector: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, received = collector
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    settings = load_settings(
        environ={
            "REVEILLE_HOME": str(state),
            "REVEILLE_PORT": "0",
            "REVEILLE_WEBUI_PORT": "0",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint + "/",
        }
    )
    _reset_trace_globals()
    try:
        async with serve(settings, provider=DemoModel(delay_seconds=0)) as app:
            await one_turn(app.adapter.port, "hello")
        # Leaving serve flushed the batch.
    finally:
        _reset_trace_globals()
    assert {path for path, _, _ in received} == {"/v1/traces"}
    assert {kind for _, kind, _ in received} == {"application/x-protobuf"}
    names, services = set(), set()
    for _, _, body in received:
        export = ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            for attribute in resource_spans.resource.attributes:
                if attribute.key == "service.name":
                    services.add(attribute.value.string_value)
            for scope in resource_spans.scope_spans:
                names.update(span.name for span in scope.spans)
    assert services == {"reveille"}
    assert "reveille.turn" in names


def test_the_endpoint_is_a_setting_in_the_file_and_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[otel]\nendpoint = "http://collector:4318"\n')
    assert load_settings(environ={}, config_file=config).otel_endpoint == "http://collector:4318"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otel.example"}
    assert load_settings(environ=env, config_file=config).otel_endpoint == "https://otel.example"
    with pytest.raises(SettingsError, match="otel_endpoint"):
        load_settings(
            environ={
                "REVEILLE_HOME": str(tmp_path),
                "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318",
            }
        )


def test_tracing_stays_off_without_an_endpoint_or_when_the_sdk_is_disabled(
    tmp_path: Path,
) -> None:
    from reveille import tracing

    assert tracing.configure(Settings(home=tmp_path), environ={}) is None
    on = Settings(home=tmp_path, otel_endpoint="http://127.0.0.1:9")
    assert tracing.configure(on, environ={"OTEL_SDK_DISABLED": "true"}) is None
