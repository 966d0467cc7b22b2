"""The lifecycle in the composition root: ``serve()`` opens in order and closes in reverse,
whatever fails, and hands the background-process registry its directory."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

import tools.async_delegation as ad
from agent.providers.demo import DemoModel
from gateway.session import SessionStoreError
from reveille.app import serve
from reveille.settings import Settings
from tools.process_registry import process_registry


@pytest.fixture(autouse=True)
def _no_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path / "env-home"))
    ad.reset_runtime()
    process_registry.completion_queue.drain()
    yield
    ad.reset_runtime()
    process_registry.completion_queue.drain()


def settings(home: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {"home": home, "port": 0, "webui_port": 0, "api_key": "k"}
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


async def test_serve_opens_everything_and_closes_it_in_reverse(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with serve(settings(home), provider=DemoModel(delay_seconds=0)) as app:
        assert ad.runtime_is_open() and ad.get_runtime() is app.runtime
        assert app.runtime.scheduler is not None  # started once the servers listen
        assert process_registry.processes_dir == home / "processes"
        url = f"http://127.0.0.1:{app.adapter.port}/health"
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            assert resp.status == 200
        store, port = app.store, app.adapter.port
    # Everything it opened is closed: the runtime (and its scheduler), the registry's
    # directory, the API server's port, the session store.
    assert not ad.runtime_is_open()
    assert process_registry.processes_dir == tmp_path / "env-home" / "processes"
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    with pytest.raises(SessionStoreError):
        store.get_session("s")


async def test_a_port_in_use_closes_what_was_already_open(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            async with serve(settings(tmp_path, port=port), provider=DemoModel()):
                pytest.fail("started on a port in use")
    assert not ad.runtime_is_open()
    assert process_registry.processes_dir == tmp_path / "env-home" / "processes"
