"""The composition root: storage urls, and a runner wired from settings alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from reveille.app import open_storage
from reveille.settings import SettingsError


def test_a_sqlite_url_names_the_state_directory(tmp_path: Path) -> None:
    where = open_storage(f"sqlite://{tmp_path.as_posix()}")
    assert where.ledger_path == tmp_path / "ledger.db"
    assert where.sessions_path == tmp_path / "sessions.db"


@pytest.mark.parametrize(
    "url", ["postgres://db/reveille", "sqlite://host/var/lib/reveille", "/var/lib", ""]
)
def test_a_url_reveille_cannot_open_is_refused_with_its_reason(url: str) -> None:
    with pytest.raises(SettingsError, match="storage url"):
        open_storage(url)
