"""Slack's settings: ``[slack]`` in the file, ``SLACK_*`` in the environment, and the values
refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from reveille.app import CHAT_PLATFORMS
from reveille.settings import SettingsError, load_settings


def test_slack_is_off_by_default(tmp_path: Path) -> None:
    s = load_settings({"REVEILLE_HOME": str(tmp_path)})
    assert (s.slack_bot_token, s.slack_allowed_user_ids) == ("", frozenset())
    assert s.slack_base_url == "https://slack.com/api/"
    assert not [p for p in CHAT_PLATFORMS if p.configured(s)]


def test_file_then_environment_and_the_bot_token_starts_it(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        '[slack]\nbot_token = "xoxb-1"\napp_token = "xapp-1"\n'
        'allowed_users = ["U0ME", "U0YOU"]\nbase_url = "http://127.0.0.1:9/api/"\n'
    )
    s = load_settings({"REVEILLE_HOME": str(tmp_path)})
    assert (s.slack_bot_token, s.slack_app_token) == ("xoxb-1", "xapp-1")
    assert s.slack_allowed_user_ids == frozenset({"U0ME", "U0YOU"})
    assert s.slack_base_url == "http://127.0.0.1:9/api/"
    assert [p.name for p in CHAT_PLATFORMS if p.configured(s)] == ["slack"]
    s = load_settings({"REVEILLE_HOME": str(tmp_path), "SLACK_SIGNING_SECRET": "shh"})
    assert s.slack_signing_secret == "shh"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SLACK_BOT_TOKEN": "xoxb-1"}, "SLACK_APP_TOKEN .* or SLACK_SIGNING_SECRET"),
        (
            {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "x", "SLACK_BASE_URL": "slack.com"},
            "not an http",
        ),
    ],
)
def test_refused_with_the_reason(tmp_path: Path, env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings({"REVEILLE_HOME": str(tmp_path), **env})


def test_the_banner_says_how_events_arrive_and_who_may_talk(tmp_path: Path) -> None:
    from reveille.banner import slack_summary

    off = load_settings({"REVEILLE_HOME": str(tmp_path)})
    assert slack_summary(off).startswith("off")
    both = load_settings(
        {
            "REVEILLE_HOME": str(tmp_path),
            "SLACK_BOT_TOKEN": "xoxb-1",
            "SLACK_APP_TOKEN": "xapp-1",
            "SLACK_SIGNING_SECRET": "s",
        }
    )
    line = slack_summary(both)
    assert "Socket Mode and the Events API" in line and "NO allowed users" in line
    assert "xoxb" not in line and "xapp" not in line
