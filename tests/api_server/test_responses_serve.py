"""Background responses across real `reveille serve` processes: a SIGKILLed server's response
ends failed with a reason after the restart (never stuck in_progress), and two servers on
one PostgreSQL database answer for each other's responses, streams included.

The model is ``FakeOpenAI`` on loopback (in a thread of its own), streaming "Hello" and then
waiting on a gate the test opens.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.agent.test_openai_compat import FakeOpenAI
from tests.api_server.serve_support import KEY, Server, call, wait_until
from tests.api_server.test_responses import Gate


class ThreadedFake:
    """``FakeOpenAI`` served from a thread with its own event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.fake = FakeOpenAI()
        self.gate, self.second = Gate(), Gate()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.fake.start(), self.loop).result(10)
        self.fake.script = [self.gate.handler(), self.second.handler()]

    def open_gate(self, gate: Gate | None = None) -> None:
        self.loop.call_soon_threadsafe((gate or self.gate).opened.set)

    def close(self) -> None:
        self.open_gate()
        self.open_gate(self.second)
        asyncio.run_coroutine_threadsafe(self.fake.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture
def upstream() -> Iterator[ThreadedFake]:
    fake = ThreadedFake()
    yield fake
    fake.close()


def model_env(fake: ThreadedFake, **extra: str) -> dict[str, str]:
    return {
        "REVEILLE_PROVIDER": "openai",
        "OPENAI_BASE_URL": fake.fake.base_url,
        "OPENAI_API_KEY": "upstream-key",
        "REVEILLE_MODEL": "fake-model",
        **extra,
    }


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=30)


def status_of(server: Server, response_id: str) -> str:
    return client(server).responses.retrieve(response_id).status


def test_a_sigkilled_servers_response_ends_failed_with_a_reason(
    tmp_path: Path, upstream: ThreadedFake
) -> None:
    home = tmp_path / "home"
    first = Server(home, extra_env=model_env(upstream))
    try:
        made = client(first).responses.create(model="fake-model", input="hi", background=True)
        assert made.status == "queued"
        wait_until(lambda: upstream.gate.started.is_set())
        assert status_of(first, made.id) == "in_progress"
    finally:
        first.stop(signal.SIGKILL)

    second = Server(home, extra_env=model_env(upstream))
    try:
        ended = wait_until(
            lambda: (r := client(second).responses.retrieve(made.id)).status != "in_progress" and r
        )
        assert ended.status == "failed"
        assert ended.error is not None and "stopped before it finished" in ended.error.message
        # The stored stream ends with it too: a client resuming it is not left waiting.
        events = list(client(second).responses.retrieve(made.id, stream=True, starting_after=0))
        assert events[-1].type == "response.failed"
        assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
        # What its stream had shown stays in the object, as an incomplete message.
        shown = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert ended.output_text == shown
        assert all(item.status == "incomplete" for item in ended.output)
    finally:
        second.stop()


def test_two_servers_on_one_postgres_answer_for_each_other(
    tmp_path: Path, upstream: ThreadedFake
) -> None:
    from tests.pg_support import fresh_url

    url = fresh_url()
    env = model_env(upstream, REVEILLE_DATABASE_URL=url)
    a = Server(tmp_path / "a", extra_env=env)
    b = Server(tmp_path / "b", extra_env=env)
    try:
        made = client(a).responses.create(model="fake-model", input="hi", background=True)
        wait_until(lambda: upstream.gate.started.is_set())
        assert status_of(b, made.id) == "in_progress"
        events: list[Any] = []
        stream = client(b).responses.retrieve(made.id, stream=True, starting_after=0)
        for event in stream:
            events.append(event)
            if event.type == "response.output_text.delta":
                upstream.open_gate()  # the rest happens on server A, live on B's stream
        assert events[0].sequence_number == 1
        assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
        assert events[-1].type == "response.completed"
        assert events[-1].response.output_text == "Hello world"
        assert client(b).responses.retrieve(made.id).output_text == "Hello world"
        assert client(b).responses.cancel(made.id).status == "completed"  # nothing to cancel
        client(b).responses.delete(made.id)
        with pytest.raises(openai.NotFoundError):
            client(a).responses.retrieve(made.id)

        # Cancelled through B, the run on A stops (A learns it from the store).
        running = client(a).responses.create(model="fake-model", input="again", background=True)
        wait_until(lambda: upstream.second.started.is_set())
        assert client(b).responses.cancel(running.id).status == "cancelled"
        assert client(b).responses.cancel(running.id).status == "cancelled"
        wait_until(lambda: call(a.port, "GET", "/health")[2]["background_runs"] == 0)
        assert not upstream.second.opened.is_set()  # stopped, not finished
        assert status_of(a, running.id) == "cancelled"
    finally:
        a.stop()
        b.stop()
