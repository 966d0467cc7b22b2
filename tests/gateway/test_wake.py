"""gateway.wake beyond the seed: idempotency, addressing, error classes, text, persistence."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import gateway.wake as wake_mod
from gateway.config import Platform
from gateway.session import SessionGone, SessionSource
from gateway.wake import (
    DELEGATION_DISPLAY_KIND,
    WakeDeliveryError,
    delegation_counts,
    deliver_wake,
    format_wake_text,
    persist_delegation_delivery,
)
from tests.ports import free_port
from tests.sessions._support import make_session, take_unfolded
from tests.stores import session_file_store

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SECRET = "sk-very-secret-key-123"


class ApiAdapter:
    supports_async_delivery = False

    def __init__(self, host: str = "127.0.0.1", port: int = 0, key: str = SECRET, **extra: Any):
        self._host = host
        self._port = port
        self._api_key = key
        for name, value in extra.items():
            setattr(self, name, value)


class PushAdapter:
    def __init__(self) -> None:
        self.events: list[Any] = []

    async def handle_message(self, event: Any) -> str:
        self.events.append(event)
        return "ok"


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wake_mod, "_RETRY_DELAYS_SECONDS", (0.01, 0.01, 0.01))


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[int]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler, host: str = "127.0.0.1") -> int:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, host, 0)
        await site.start()
        runners.append(runner)
        return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    yield start
    for runner in runners:
        await runner.cleanup()


def _recorder(statuses: list[int]) -> tuple[Handler, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append({"headers": dict(request.headers), "body": await request.json()})
        status = statuses[min(len(seen), len(statuses)) - 1]
        if status >= 300:
            return web.json_response({"error": {"message": "nope"}}, status=status)
        return web.json_response({"id": "chatcmpl-1", "choices": [{"message": {"content": "ok"}}]})

    return handler, seen


# ----------------------------------------------------------------- self-POST


async def test_idempotency_key_identical_across_429_retries(serve) -> None:
    handler, seen = _recorder([429, 429, 200])
    port = await serve(handler)
    result = await deliver_wake(
        ApiAdapter(port=port), text="wake", session_id="sid", idempotency_key="deleg_abc"
    )
    completion = {"id": "chatcmpl-1", "choices": [{"message": {"content": "ok"}}]}
    assert result is not None and result["completion"] == completion
    assert {k: result[k] for k in completion} == completion  # the old shape still reads
    assert result["requested_session_id"] == result["effective_session_id"] == "sid"
    assert [s["headers"]["Idempotency-Key"] for s in seen] == ["deleg_abc"] * 3


async def test_generated_idempotency_key_is_stable_within_a_call(serve) -> None:
    handler, seen = _recorder([429, 200, 200])
    port = await serve(handler)
    await deliver_wake(ApiAdapter(port=port), text="a", session_id="sid")
    await deliver_wake(ApiAdapter(port=port), text="b", session_id="sid")
    keys = [s["headers"]["Idempotency-Key"] for s in seen]
    assert len(keys) == 3 and keys[0] == keys[1] and keys[2] != keys[0]
    assert all(keys)


async def test_request_shape_and_model(serve) -> None:
    handler, seen = _recorder([200])
    port = await serve(handler)
    await deliver_wake(ApiAdapter(port=port, _model_name="m-1"), text="t", session_id="s:1.x")
    (req,) = seen
    assert req["headers"]["X-Hermes-Session-Id"] == "s:1.x"
    assert req["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert req["body"] == {
        "model": "m-1",
        "messages": [{"role": "user", "content": "t"}],
        "stream": False,
    }


async def test_default_model_name(serve) -> None:
    handler, seen = _recorder([200])
    port = await serve(handler)
    await deliver_wake(ApiAdapter(port=port), text="t", session_id="s")
    assert seen[0]["body"]["model"] == "reveille"


async def test_429_exhausted_gives_up_transient(serve) -> None:
    handler, seen = _recorder([429])
    port = await serve(handler)
    with pytest.raises(WakeDeliveryError, match="gave up") as info:
        await deliver_wake(ApiAdapter(port=port), text="x", session_id="sid")
    assert info.value.transient is True and info.value.status == 429
    assert isinstance(info.value, RuntimeError)
    assert "after 4 attempt(s)" in str(info.value)
    assert len(seen) == 4  # first attempt + one retry per delay


async def test_500_raises_at_once_not_transient(serve) -> None:
    handler, seen = _recorder([500])
    port = await serve(handler)
    with pytest.raises(RuntimeError, match="HTTP 500") as info:
        await deliver_wake(ApiAdapter(port=port), text="x", session_id="sid")
    assert len(seen) == 1
    assert isinstance(info.value, WakeDeliveryError)
    assert info.value.transient is False and info.value.status == 500


@pytest.mark.parametrize("code", [502, 503, 504])
async def test_gateway_errors_are_transient_but_not_retried(serve, code: int) -> None:
    handler, seen = _recorder([code])
    port = await serve(handler)
    with pytest.raises(WakeDeliveryError, match=f"HTTP {code}") as info:
        await deliver_wake(ApiAdapter(port=port), text="x", session_id="sid")
    assert info.value.transient is True
    assert len(seen) == 1


async def test_redirect_is_not_followed(serve) -> None:
    async def handler(request: web.Request) -> web.Response:
        raise web.HTTPFound("http://example.invalid/steal")

    port = await serve(handler)
    with pytest.raises(WakeDeliveryError, match="HTTP 302"):
        await deliver_wake(ApiAdapter(port=port), text="x", session_id="sid")


async def test_non_json_success_returns_an_empty_completion(serve) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="fine")

    port = await serve(handler)
    result = await deliver_wake(ApiAdapter(port=port), text="x", session_id="sid")
    assert result is not None and result["completion"] == {}


async def test_connection_refused_gives_up_transient() -> None:
    port = free_port()  # nobody listens on it
    with pytest.raises(WakeDeliveryError, match="gave up") as info:
        await deliver_wake(ApiAdapter(port=port), text="x", session_id="sid")
    assert info.value.transient is True


async def test_timeout_bounds_the_whole_call(serve) -> None:
    release = asyncio.Event()
    calls = {"n": 0}

    async def hang(request: web.Request) -> web.Response:
        calls["n"] += 1
        await release.wait()
        return web.json_response({})

    port = await serve(hang)
    started = time.monotonic()
    try:
        with pytest.raises(WakeDeliveryError, match="gave up") as info:
            await deliver_wake(ApiAdapter(port=port), text="x", session_id="sid", timeout=0.4)
    finally:
        release.set()
    assert time.monotonic() - started < 2.0
    assert info.value.transient is True
    assert "timeout budget" in str(info.value)
    assert calls["n"] >= 1


async def test_server_disconnect_is_retried_with_same_key(serve) -> None:
    keys: list[str] = []

    async def flaky(request: web.Request) -> web.Response:
        keys.append(request.headers["Idempotency-Key"])
        if len(keys) == 1:
            assert request.transport is not None
            request.transport.close()  # drop the connection without answering
        return web.json_response({"ok": True})

    port = await serve(flaky)
    result = await deliver_wake(ApiAdapter(port=port), text="x", session_id="sid")
    assert result is not None and result["completion"] == {"ok": True}
    assert len(keys) == 2 and keys[0] == keys[1]


async def test_key_never_logged_or_raised(serve, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    handler, _ = _recorder([429])
    port = await serve(handler)
    errors: list[str] = []
    for adapter in (ApiAdapter(port=port), ApiAdapter(port=1)):
        with pytest.raises(RuntimeError) as info:
            await deliver_wake(adapter, text="x", session_id="sid")
        errors.append(str(info.value))
    assert caplog.records  # the retries were logged...
    assert SECRET not in caplog.text  # ...without the key
    assert all(SECRET not in e for e in errors)


async def test_malformed_session_id_rejected_before_any_request() -> None:
    with pytest.raises(ValueError, match="malformed"):
        await deliver_wake(ApiAdapter(port=1), text="x", session_id="bad id\r\nX-Evil: 1")
    with pytest.raises(ValueError, match="timeout"):
        await deliver_wake(ApiAdapter(port=1), text="x", session_id="sid", timeout=0)


# ----------------------------------------------------------------- addressing


@pytest.mark.parametrize(
    ("host", "port", "url"),
    [
        ("0.0.0.0", 9000, "http://127.0.0.1:9000/v1/chat/completions"),
        ("", 9000, "http://127.0.0.1:9000/v1/chat/completions"),
        (None, None, "http://127.0.0.1:8642/v1/chat/completions"),
        ("::", 9000, "http://[::1]:9000/v1/chat/completions"),
        ("[::]", 9000, "http://[::1]:9000/v1/chat/completions"),
        ("::1", 0, "http://[::1]:8642/v1/chat/completions"),
        ("fd00::5", 1234, "http://[fd00::5]:1234/v1/chat/completions"),
        ("[fd00::5]", 1234, "http://[fd00::5]:1234/v1/chat/completions"),
        ("10.1.2.3", 1234, "http://10.1.2.3:1234/v1/chat/completions"),
        ("api.local", 1234, "http://api.local:1234/v1/chat/completions"),
    ],
)
def test_self_post_url(host: str | None, port: int | None, url: str) -> None:
    adapter = ApiAdapter(host=host, port=port)  # type: ignore[arg-type]
    assert wake_mod._self_post_url(adapter) == url


def test_self_post_url_without_host_or_port_attributes() -> None:
    class Bare:
        supports_async_delivery = False

    assert wake_mod._self_post_url(Bare()) == "http://127.0.0.1:8642/v1/chat/completions"


def _ipv6_loopback_available() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback_available(), reason="no IPv6 loopback")
@pytest.mark.parametrize("host", ["::1", "::"])
async def test_ipv6_self_post_reaches_server(serve, host: str) -> None:
    handler, seen = _recorder([200])
    port = await serve(handler, host="::1")
    await deliver_wake(ApiAdapter(host=host, port=port), text="v6", session_id="sid")
    assert len(seen) == 1
    assert seen[0]["headers"]["Host"] == f"[::1]:{port}"


# ----------------------------------------------------------------- push path


async def test_push_passes_session_id_and_idempotency_key() -> None:
    adapter = PushAdapter()
    src = SessionSource(Platform.DISCORD, chat_id="c", thread_id="t")
    assert (
        await deliver_wake(adapter, text="w", source=src, session_id="sid", idempotency_key="k1")
        is None
    )
    (evt,) = adapter.events
    assert evt.internal is True and evt.session_id == "sid" and evt.source is src
    assert evt.metadata == {"idempotency_key": "k1"}


async def test_push_handler_failure_propagates() -> None:
    class Broken:
        async def handle_message(self, event: Any) -> None:
            raise ConnectionError("platform down")

    with pytest.raises(ConnectionError):
        await deliver_wake(Broken(), text="w", source=SessionSource(Platform.LOCAL, chat_id="c"))


# ----------------------------------------------------------------- text

NOW = 1_750_000_000.0
LONG = "\n".join(f"line {i}: " + "x" * 80 for i in range(2000))  # ~180 kB


def _single(**over: Any) -> dict[str, Any]:
    evt = {
        "type": "async_delegation",
        "delegation_id": "deleg_0123abcd",
        "session_key": "agent:main:telegram:dm:1",
        "goal": "Audit the billing module for rounding bugs",
        "context": "User reported invoices off by one cent",
        "toolsets": ["terminal", "file"],
        "role": "auditor",
        "model": "m-large",
        "status": "completed",
        "summary": LONG,
        "duration_seconds": 754.2,
        "dispatched_at": NOW - 3600 - 125,
        "completed_at": NOW - 10,
    }
    evt.update(over)
    return evt


def test_format_single_delegation_is_self_contained() -> None:
    text = format_wake_text(_single(), now=NOW)
    assert "deleg_0123abcd" in text
    assert "Goal: Audit the billing module for rounding bugs" in text
    assert "Context: User reported invoices off by one cent" in text
    assert "Dispatched: 2025-06-15T14:04:35Z (1h 02m 05s ago)" in text
    assert "Duration: 12m 34s" in text
    assert "Status: completed" in text
    assert "Toolsets: terminal, file" in text and "Role: auditor" in text
    assert LONG in text  # the full result, never truncated
    assert "automatic wake-up" in text


def test_format_single_failure_has_full_error() -> None:
    text = format_wake_text(_single(status="failed", summary=None, error=LONG), now=NOW)
    assert "Status: failed" in text
    assert "Error:\n" + LONG in text


def test_format_interrupted_notes_abnormal_end() -> None:
    text = format_wake_text(
        _single(status="interrupted", summary=None, error="owner process exited"), now=NOW
    )
    assert "did not finish normally" in text and "owner process exited" in text


def test_format_iso_dispatch_time() -> None:
    text = format_wake_text(_single(dispatched_at="2025-06-15T15:00:00+00:00"), now=NOW)
    assert "Dispatched: 2025-06-15T15:00:00Z (6m 40s ago)" in text
    text = format_wake_text(_single(dispatched_at="yesterday-ish"), now=NOW)
    assert "Dispatched: yesterday-ish" in text


def test_format_batch_lists_goals_and_every_result() -> None:
    evt = {
        "type": "async_delegation",
        "delegation_id": "deleg_batch1",
        "is_batch": True,
        "goals": ["Scan repo A", "Scan repo B", "Scan repo C"],
        "context": "Quarterly dependency review",
        "status": "completed",
        "results": [
            {"status": "completed", "summary": LONG, "duration_seconds": 5},
            {"status": "failed", "error": "clone failed: " + LONG},
            {"status": "completed", "summary": "C is clean", "goal": "Scan repo C (mirror)"},
        ],
        "total_duration_seconds": 4000,
        "dispatched_at": NOW - 4000,
    }
    text = format_wake_text(evt, now=NOW)
    assert "3 task(s), 2 completed, 1 failed" in text
    assert "  1. Scan repo A\n  2. Scan repo B\n  3. Scan repo C" in text
    assert "Context: Quarterly dependency review" in text
    assert "Total duration: 1h 06m 40s" in text
    assert "### Task 1 of 3: completed (5.0s)" in text
    assert "### Task 2 of 3: failed" in text
    assert "Goal: Scan repo B" in text and "Goal: Scan repo C (mirror)" in text
    assert text.count(LONG) == 2
    assert "C is clean" in text


def test_format_process_completion() -> None:
    evt = {
        "type": "completion",
        "session_id": "proc_42",
        "command": "pytest -x tests/",
        "exit_code": 1,
        "duration_seconds": 61,
        "output": "FAILED tests/test_a.py::test_b\n" + LONG,
    }
    text = format_wake_text(evt, now=NOW)
    assert "Command: pytest -x tests/" in text
    assert "Exit code: 1" in text
    assert "Duration: 1m 01s" in text
    assert "Process: proc_42" in text
    assert "FAILED tests/test_a.py::test_b\n" + LONG in text


def test_format_generic_event() -> None:
    text = format_wake_text({"type": "watch_match", "pattern": "ERROR", "line": LONG, "n": None})
    assert "watch_match" in text and "pattern: ERROR" in text and LONG in text
    assert "\nn:" not in text


def test_delegation_counts() -> None:
    assert delegation_counts(_single()) == {"tasks": 1, "completed": 1, "failed": 0}
    assert delegation_counts(_single(status="error")) == {"tasks": 1, "completed": 0, "failed": 1}
    batch = {
        "is_batch": True,
        "results": [{"status": "completed"}, {"status": "failed"}, {"status": "cancelled"}],
    }
    assert delegation_counts(batch) == {"tasks": 3, "completed": 1, "failed": 2}
    assert delegation_counts({"is_batch": True, "goals": ["a", "b"]}) == {
        "tasks": 2,
        "completed": 0,
        "failed": 2,
    }


# ----------------------------------------------------------------- persistence


def test_persist_delegation_delivery_once(tmp_path: Path) -> None:
    with session_file_store(tmp_path / "s.db") as store:
        make_session(store, "api-sess")
        evt = _single()
        row = persist_delegation_delivery(store, "api-sess", evt)
        assert row.role == "system"
        assert row.display_kind == DELEGATION_DISPLAY_KIND == "async_delegation_complete"
        assert LONG in row.content
        meta = row.display_metadata
        assert meta["delegation_id"] == "deleg_0123abcd"
        assert (meta["tasks"], meta["completed"], meta["failed"]) == (1, 1, 0)
        assert meta["goal"] == evt["goal"] and meta["status"] == "completed"
        assert meta["dispatched_at"] == evt["dispatched_at"]
        assert meta["completed_at"] == evt["completed_at"]

        again = persist_delegation_delivery(store, "api-sess", evt, text="other text")
        assert again == row
        assert len(store.messages("api-sess")) == 1
        assert [m["id"] for m in take_unfolded(store, "api-sess")] == [row.id]
        assert take_unfolded(store, "api-sess") == []


def test_persist_batch_metadata_and_custom_text(tmp_path: Path) -> None:
    with session_file_store(tmp_path / "s.db") as store:
        make_session(store, "s")
        evt = {
            "type": "async_delegation",
            "delegation_id": "deleg_b",
            "is_batch": True,
            "goals": ["a", "b"],
            "results": [{"status": "completed"}, {"status": "failed"}],
        }
        row = persist_delegation_delivery(store, "s", evt, text="custom")
        assert row.content == "custom"
        meta = row.display_metadata
        assert meta["goals"] == ["a", "b"] and meta["is_batch"] is True
        assert (meta["tasks"], meta["completed"], meta["failed"]) == (2, 1, 1)
        assert meta["status"] == "failed"  # derived when the event has none


def test_persist_rejects_unknown_session_and_bad_events(tmp_path: Path) -> None:
    with session_file_store(tmp_path / "s.db") as store:
        with pytest.raises(SessionGone):
            persist_delegation_delivery(store, "gone", _single())
        make_session(store, "s")
        with pytest.raises(ValueError, match="delegation_id"):
            persist_delegation_delivery(store, "s", _single(delegation_id=None))
        with pytest.raises(ValueError, match="not a delegation"):
            persist_delegation_delivery(store, "s", {"type": "completion", "delegation_id": "x"})
        assert store.messages("s") == []


async def test_persist_takes_hermes_agents_call_shape_too(tmp_path: Path) -> None:
    from types import SimpleNamespace

    evt = {
        "type": "async_delegation",
        "delegation_id": "deleg_hermes",
        "goal": "g",
        "status": "completed",
        "summary": "done",
    }
    with session_file_store(tmp_path / "s.db") as store:
        sid = make_session(store).id
        adapter = SimpleNamespace(store=store)
        for _ in range(2):  # a redelivery appends nothing
            row = await persist_delegation_delivery(
                adapter, text="the result", session_id=sid, evt=evt, profile=""
            )
            assert row.display_kind == "async_delegation_complete"
        assert [m.content for m in store.messages(sid)] == ["the result"]
        with pytest.raises(TypeError):
            persist_delegation_delivery(object(), session_id=sid, evt=evt)
