"""Fixtures of the ledger tests; ``backend`` runs each conformance test over every backend.

A new backend (PostgreSQL) joins the conformance suite by adding one name to ``BACKENDS``
and one branch to ``make_backend`` (both in ``_support.py``). Tests of one backend's own
storage (the SQLite file, group commit, crashes) build that backend directly instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from delivery.backend import LedgerBackend
from delivery.ledger import Ledger
from tests.delivery._support import BACKENDS, FakeClock, make_backend


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture(params=BACKENDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def backend(backend_kind: str, tmp_path: Path) -> Iterator[LedgerBackend]:
    b = make_backend(backend_kind, tmp_path)
    yield b
    b.close()


@pytest.fixture
def ledger(backend: LedgerBackend, clock: FakeClock) -> Ledger:
    return Ledger(backend, clock=clock, monotonic=clock.monotonic)
