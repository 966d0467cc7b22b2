"""Suite-wide: the web UI is off unless a test turns it on, so that servers (in-process and
subprocesses, which inherit the environment) never contend for its default port; tests
marked ``both_loops`` run on asyncio's event loop and on uvloop's (``tests.event_loops``)."""

from __future__ import annotations

import pytest

from tests.event_loops import pytest_asyncio_loop_factories

__all__ = ["pytest_asyncio_loop_factories"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "both_loops: run the async test on asyncio's event loop and on uvloop's"
    )


@pytest.fixture(autouse=True)
def _webui_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REVEILLE_WEBUI_PORT", "0")
