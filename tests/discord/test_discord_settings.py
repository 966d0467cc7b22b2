"""Discord's settings: ``[discord]`` in the file, ``DISCORD_*`` in the environment, and the
values refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from reveille.settings import SettingsError, load_settings


def test_discord_is_off_by_default_and_talks_to_discord_com(tmp_path: Path) -> None:
    s = load_settings({"REVEILLE_HOME": str(tmp_path)})
    assert s.discord_bot_token == ""
    assert s.discord_allowed_user_ids == frozenset()
    assert s.discord_api_base == "https://discord.com/api/v10"


def test_file_then_environment(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        '[discord]\nbot_token = "from-file"\nallowed_users = "1, 2"\n'
        'api_base = "http://127.0.0.1:9/api/v10"\n'
    )
    s = load_settings({"REVEILLE_HOME": str(tmp_path)})
    assert s.discord_bot_token == "from-file"
    assert s.discord_allowed_user_ids == frozenset({"1", "2"})
    assert s.discord_api_base == "http://127.0.0.1:9/api/v10"
    s = load_settings(
        {"REVEILLE_HOME": str(tmp_path), "DISCORD_BOT_TOKEN": "env", "DISCORD_ALLOWED_USERS": "3"}
    )
    assert (s.discord_bot_token, s.discord_allowed_user_ids) == ("env", frozenset({"3"}))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DISCORD_API_BASE": "discord.com/api"}, "not an http"),
        ({"DISCORD_BOT_TOKEN": "t", "REVEILLE_WORKERS": "2"}, "each worker would answer"),
    ],
)
def test_bad_values_are_refused_with_the_reason(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings({"REVEILLE_HOME": str(tmp_path), **env})
