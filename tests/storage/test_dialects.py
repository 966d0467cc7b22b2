"""The opener picks one dialect object by the url's scheme and asks it for everything; the
shared SQL takes the dialect's placeholder one way (``storage.sql.marked``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import open_storage, sqlite_files
from storage.opener import StorageUrlError
from storage.sql import SETTLED, UpdateCompiler, marked, settled_page
from tests.pg_support import fresh_url


def test_a_sqlite_url_opens_the_sqlite_dialect_of_that_directory(tmp_path: Path) -> None:
    location = open_storage(f"sqlite://{tmp_path.as_posix()}")
    assert location.name == "sqlite" and location.dialect.placeholder == "?"
    assert location.describe() == str(tmp_path)
    assert not location.has("ledger")  # nothing is made until a store is opened
    location.open_ledger().close()
    assert location.has("ledger") and (tmp_path / "ledger.db").is_file()
    assert location.schema() is None  # files migrate themselves as they open
    assert [r.path for r in location.reclaim_space()] == [str(tmp_path / "ledger.db")]


def test_an_operators_look_never_makes_a_state_directory(tmp_path: Path) -> None:
    home = tmp_path / "not-yet"
    location = open_storage(f"sqlite://{home.as_posix()}", migrate=False)
    assert not location.has("ledger") and not location.has("sessions")
    assert not home.exists()


def test_sqlite_files_names_only_what_it_is_given(tmp_path: Path) -> None:
    location = sqlite_files(ledger=tmp_path / "l.db")
    location.open_ledger().close()
    assert location.has("ledger") and not location.has("sessions")
    with pytest.raises(StorageUrlError, match="no session store file"):
        location.open_sessions()


def test_the_memory_dialect_has_every_store_and_nothing_to_back_up(tmp_path: Path) -> None:
    from storage.opener import BackupUnavailable

    location = open_storage("memory://t")
    assert location.name == "memory" and location.has("webui")
    assert location.reclaim_space() == [] and location.schema() is None
    with pytest.raises(BackupUnavailable, match="one process"):
        location.backup(tmp_path)


@pytest.mark.parametrize("url", ["mysql://db/reveille", "sqlite://host/x", "/var/lib", ""])
def test_a_url_no_dialect_opens_is_refused_with_its_reason(url: str) -> None:
    with pytest.raises(StorageUrlError, match="storage url"):
        open_storage(url)


def test_the_postgresql_dialect_reports_its_schema() -> None:
    location = open_storage(fresh_url())
    assert location.name == "postgres" and location.dialect.placeholder == "%s"
    report = location.schema()
    assert report is not None and report.current == report.latest and not report.pending
    assert location.has("ledger")


def test_shared_sql_binds_the_placeholder_one_way() -> None:
    assert marked("a = ? AND b = ?", "?") == "a = ? AND b = ?"
    assert marked("a = ? AND b = ?", "%s") == "a = %s AND b = %s"
    assert "?" not in marked(SETTLED, "%(before)s")
    assert "?" not in settled_page("%s")
    sql, _ = UpdateCompiler("%s").statement("r1", {"state": "running"}, {"state": "done"})
    assert sql == "UPDATE deliveries SET state = %s WHERE id = %s AND state = %s"
    sql, _ = UpdateCompiler("?").statement("r1", {"state": "running"}, {"state": "done"})
    assert sql == "UPDATE deliveries SET state = ? WHERE id = ? AND state = ?"
