"""Shared fixtures of the agent tests."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from tools import async_delegation
from tools.process_registry import ProcessRegistry, process_registry


@pytest.fixture
def real_runtime(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> Iterator[tuple[ModuleType, ProcessRegistry]]:
    """The real ledger runtime on a fresh state directory, and the process registry."""
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path / "home"))
    async_delegation.reset_runtime()
    yield async_delegation, process_registry
    async_delegation.reset_runtime()
