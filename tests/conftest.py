"""Suite-wide: the web UI is off unless a test turns it on, so that servers (in-process and
subprocesses, which inherit the environment) never contend for its default port."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _webui_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REVEILLE_WEBUI_PORT", "0")
