"""The composition root: storage urls, and a runner wired from settings alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from reveille.app import open_storage
from reveille.settings import SettingsError
from tests.sessions._support import make_session
from tests.stores import session_file_store


def test_a_sqlite_url_names_the_state_directory(tmp_path: Path) -> None:
    where = open_storage(f"sqlite://{tmp_path.as_posix()}")
    assert where.dialect.path("ledger") == tmp_path / "ledger.db"
    assert where.dialect.path("sessions") == tmp_path / "sessions.db"


@pytest.mark.parametrize(
    "url", ["mysql://db/reveille", "sqlite://host/var/lib/reveille", "/var/lib", ""]
)
def test_a_url_reveille_cannot_open_is_refused_with_its_reason(url: str) -> None:
    with pytest.raises(SettingsError, match="storage url"):
        open_storage(url)


def test_a_loose_state_directory_and_its_files_are_tightened(tmp_path) -> None:
    import stat as st

    from delivery.state_dir import ensure_private_dir

    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    (home / "sessions.db").touch()
    (home / "sessions.db").chmod(0o644)
    ensure_private_dir(home)
    assert st.S_IMODE(home.stat().st_mode) == 0o700
    with session_file_store(home / "sessions.db") as store:
        make_session(store, "s1")
        for name in ("sessions.db", "sessions.db-wal", "sessions.db-shm"):
            assert st.S_IMODE((home / name).stat().st_mode) == 0o600, name


def test_a_shared_state_directory_is_refused_with_a_message(tmp_path) -> None:
    import pytest

    from reveille.app import open_storage
    from reveille.settings import SettingsError

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: sticky, open to all; not ours to change
    with pytest.raises(SettingsError, match="open to other users"):
        open_storage(f"sqlite://{shared}")
    assert shared.stat().st_mode & 0o1777 == 0o1777


def test_the_command_says_its_version(capsys) -> None:
    from reveille import version
    from reveille.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"reveille {version()} (commit ")
