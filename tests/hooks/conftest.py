"""Fixtures of the inbound-event tests: a ledger and an inbound-event store sharing one
backend (the ledger's SQLite file, one PostgreSQL schema, or memory), on a clock the test
moves by hand."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import storage
from delivery.inbound_backend import HookBackend
from delivery.ledger import Ledger
from tests.delivery._support import BACKENDS, FakeClock


@dataclass
class Stores:
    ledger: Ledger
    hooks: HookBackend
    clock: FakeClock


@pytest.fixture(params=BACKENDS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    kind = str(request.param)
    if kind == "sqlite":
        opened = storage.sqlite_files(ledger=tmp_path / "ledger.db")
    elif kind == "memory":
        opened = storage.open_storage("memory://")
    else:
        from tests.pg_support import fresh_url

        opened = storage.open_storage(fresh_url())
    backend = opened.open_ledger()
    hooks = opened.open_hooks()
    clock = FakeClock()
    yield Stores(Ledger(backend, clock=clock, monotonic=clock.monotonic), hooks, clock)
    hooks.close()
    backend.close()
