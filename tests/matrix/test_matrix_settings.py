"""Matrix's settings: ``[matrix]`` in the file, ``MATRIX_*`` in the environment, and the
values refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from reveille.app import CHAT_PLATFORMS
from reveille.settings import SettingsError, load_settings

BOT = {"MATRIX_HOMESERVER": "http://127.0.0.1:9", "MATRIX_USER_ID": "@bot:hs"}


def test_matrix_is_off_by_default(tmp_path: Path) -> None:
    s = load_settings({"REVEILLE_HOME": str(tmp_path)})
    assert (s.matrix_homeserver, s.matrix_allowed_user_ids) == ("", frozenset())
    assert not [p for p in CHAT_PLATFORMS if p.configured(s)]


def test_file_then_environment_and_the_homeserver_starts_it(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        '[matrix]\nhomeserver = "https://matrix.example.org"\nuser_id = "@bot:example.org"\n'
        'password = "pw"\nallowed_users = ["@me:example.org", "@you:example.org"]\n'
    )
    s = load_settings({"REVEILLE_HOME": str(tmp_path)})
    assert s.matrix_homeserver == "https://matrix.example.org"
    assert s.matrix_allowed_user_ids == frozenset({"@me:example.org", "@you:example.org"})
    assert [p.name for p in CHAT_PLATFORMS if p.configured(s)] == ["matrix"]
    s = load_settings({"REVEILLE_HOME": str(tmp_path), "MATRIX_ACCESS_TOKEN": "tok"})
    assert (s.matrix_access_token, s.matrix_password) == ("tok", "pw")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({**BOT, "MATRIX_HOMESERVER": "matrix.org", "MATRIX_PASSWORD": "p"}, "not an http"),
        ({**BOT, "MATRIX_USER_ID": "bot", "MATRIX_PASSWORD": "p"}, "@bot:example.org"),
        (BOT, "MATRIX_ACCESS_TOKEN or MATRIX_PASSWORD"),
    ],
)
def test_refused_with_the_reason(tmp_path: Path, env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings({"REVEILLE_HOME": str(tmp_path), **env})
