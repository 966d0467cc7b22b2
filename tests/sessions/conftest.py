"""Fixtures of the session-store tests; ``store`` runs each conformance test over every backend.

A new backend joins the conformance suite by adding one name to ``BACKENDS``
and one branch to ``make_backend`` (both in ``_support.py``). Facts of one backend's own
storage (the SQLite file, its pragmas and refusals) live in ``test_sqlite_sessions.py``,
which builds that backend directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from delivery.session_backend import SessionBackend
from gateway.session import SessionStore
from tests.sessions._support import BACKENDS, make_backend


@pytest.fixture(params=BACKENDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def backend(backend_kind: str, tmp_path: Path) -> Iterator[SessionBackend]:
    b = make_backend(backend_kind, tmp_path)
    yield b
    b.close()


@pytest.fixture
def store(backend: SessionBackend) -> SessionStore:
    return SessionStore(backend)
