"""Shared fixtures of the API server tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.session import SessionStore
from tests.stores import session_file_store


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SessionStore]:
    """A session store in a fresh state directory (which REVEILLE_HOME names too)."""
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    with session_file_store(tmp_path / "sessions.db") as s:
        yield s
