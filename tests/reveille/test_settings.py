"""Settings: defaults < TOML file < environment < flags, and clear errors for bad values."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from reveille.settings import SettingsError, load_settings


def test_defaults_are_loopback_demo_and_shell_off(tmp_path: Path) -> None:
    s = load_settings({"REVEILLE_HOME": str(tmp_path)})
    assert (s.host, s.port, s.provider, s.shell_enabled) == ("127.0.0.1", 8642, "demo", False)
    assert s.ledger_path == tmp_path / "ledger.db"
    assert s.delivery_policy.max_attempts == 8
    assert s.delivery_policy.lease_seconds == 300


def test_file_then_environment_then_overrides(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        '[server]\nport = 9000\napi_key = "from-file"\n[shell]\nenabled = true\n'
        "[delivery]\nmax_attempts = 3\n"
    )
    s = load_settings({"REVEILLE_HOME": str(tmp_path), "REVEILLE_PORT": "9100"})
    assert (s.port, s.api_key, s.shell_enabled, s.max_attempts) == (9100, "from-file", True, 3)
    s = load_settings({"REVEILLE_HOME": str(tmp_path)}, port=9200)
    assert s.port == 9200


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REVEILLE_PORT": "eighty"}, "$REVEILLE_PORT"),
        ({"REVEILLE_PORT": "70000"}, "port"),
        ({"REVEILLE_SHELL_ENABLED": "perhaps"}, "expected true or false"),
        ({"REVEILLE_PROVIDER": "magic"}, "provider"),
        ({"REVEILLE_LEASE_SECONDS": "0"}, "lease_seconds"),
        ({"REVEILLE_CONFIG": "/nonexistent/reveille.toml"}, "does not exist"),
    ],
)
def test_bad_values_are_refused_with_the_reason(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError, match=message.replace("$", r"\$")):
        load_settings({"REVEILLE_HOME": str(tmp_path), **env})


def test_bad_toml_and_unknown_keys_are_refused(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("[server\nport = 1")
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_settings({"REVEILLE_HOME": str(tmp_path)})
    (tmp_path / "config.toml").write_text("[server]\nprot = 1\n")
    with pytest.raises(SettingsError, match=r"unknown setting \[server\] prot"):
        load_settings({"REVEILLE_HOME": str(tmp_path)})


def test_combined_wake_up_settings_from_file_and_environment(tmp_path: Path) -> None:
    s = load_settings({"REVEILLE_HOME": str(tmp_path)})
    assert (s.coalesce_seconds, s.wake_text_budget) == (2.0, 24_000)
    (tmp_path / "config.toml").write_text(
        "[delivery]\ncoalesce_seconds = 0.5\nwake_text_budget = 8000\n"
    )
    s = load_settings({"REVEILLE_HOME": str(tmp_path)})
    assert (s.coalesce_seconds, s.wake_text_budget) == (0.5, 8000)
    env = {
        "REVEILLE_HOME": str(tmp_path),
        "REVEILLE_COALESCE_SECONDS": "0",
        "REVEILLE_WAKE_TEXT_BUDGET": "3000",
    }
    s = load_settings(env)
    assert (s.coalesce_seconds, s.wake_text_budget) == (0.0, 3000)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REVEILLE_COALESCE_SECONDS": "-1"}, "coalesce_seconds"),
        ({"REVEILLE_COALESCE_SECONDS": "600"}, "coalesce_seconds"),
        ({"REVEILLE_COALESCE_SECONDS": "soon"}, "$REVEILLE_COALESCE_SECONDS"),
        ({"REVEILLE_WAKE_TEXT_BUDGET": "100"}, "wake_text_budget"),
    ],
)
def test_bad_combined_wake_up_settings_are_refused(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)):
        load_settings({"REVEILLE_HOME": str(tmp_path), **env})


def test_retention_days_come_from_the_file_and_the_environment(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        "[retention]\nsettled_days = 10\nwebui_event_days = 0\ninterval_seconds = 60\n"
    )
    env = {"REVEILLE_HOME": str(tmp_path), "REVEILLE_RETENTION_IDEMPOTENCY_DAYS": "2.5"}
    policy = load_settings(env).retention_policy
    assert (policy.settled_days, policy.webui_event_days, policy.interval_seconds) == (10, 0, 60)
    assert policy.idempotency_days == 2.5
    assert policy.tombstone_days == 90  # the default
    bad = {**env, "REVEILLE_RETENTION_TOMBSTONE_DAYS": "-1"}
    with pytest.raises(SettingsError, match="retention_tombstone_days"):
        load_settings(bad)


def test_the_background_approval_timeout_from_file_and_environment(tmp_path: Path) -> None:
    assert load_settings({"REVEILLE_HOME": str(tmp_path)}).shell_approval_timeout == 3600.0
    (tmp_path / "config.toml").write_text("[shell]\napproval_timeout = 90\n")
    assert load_settings({"REVEILLE_HOME": str(tmp_path)}).shell_approval_timeout == 90.0
    env = {"REVEILLE_HOME": str(tmp_path), "REVEILLE_SHELL_APPROVAL_TIMEOUT": "5"}
    assert load_settings(env).shell_approval_timeout == 5.0
    for bad in ("0", "-1", "soon"):
        with pytest.raises(SettingsError, match="approval_timeout"):
            load_settings({**env, "REVEILLE_SHELL_APPROVAL_TIMEOUT": bad})


@pytest.mark.parametrize(
    ("env", "toml", "where"),
    [
        ({"REVEILLE_PORT": "70000"}, "", "$REVEILLE_PORT: port = 70000"),
        ({}, "[server]\nport = 70000\n", "config.toml [server] port: port = 70000"),
        ({}, "[server]\nport = 'eighty'\n", "config.toml [server] port: port = 'eighty'"),
        ({}, "[delivery]\nlease_seconds = 0\n", "config.toml [delivery] lease_seconds:"),
        ({"REVEILLE_LEASE_SECONDS": "-1"}, "", "$REVEILLE_LEASE_SECONDS: lease_seconds"),
        ({}, "[webhooks]\nsecret = 'nope'\n", "config.toml [webhooks] secret: webhook_secret"),
    ],
)
def test_every_setting_error_names_where_the_value_came_from(
    tmp_path: Path, env: dict[str, str], toml: str, where: str
) -> None:
    if toml:
        (tmp_path / "config.toml").write_text(toml)
    with pytest.raises(SettingsError, match=re.escape(where)):
        load_settings({"REVEILLE_HOME": str(tmp_path), **env})


def test_the_command_line_is_named_as_the_origin(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=re.escape("command line: port = 70000")):
        load_settings({"REVEILLE_HOME": str(tmp_path)}, port=70000)


def test_openai_without_a_model_is_refused_at_start(tmp_path: Path) -> None:
    env = {"REVEILLE_HOME": str(tmp_path), "REVEILLE_PROVIDER": "openai", "OPENAI_API_KEY": "sk"}
    with pytest.raises(SettingsError, match=r"\$REVEILLE_PROVIDER: .*set REVEILLE_MODEL"):
        load_settings(env)
    assert load_settings({**env, "REVEILLE_MODEL": "gpt-x"}).model == "gpt-x"
    (tmp_path / "config.toml").write_text('[model]\nname = "gpt-y"\n')
    assert load_settings(env).model == "gpt-y"


def test_openai_without_a_model_stops_reveille_serve_with_the_reason(tmp_path: Path) -> None:
    env = {**os.environ, "REVEILLE_HOME": str(tmp_path), "REVEILLE_PROVIDER": "openai"}
    env.update(OPENAI_API_KEY="sk")
    for name in ("REVEILLE_MODEL", "REVEILLE_CONFIG"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "reveille.cli", "serve", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "bad setting: $REVEILLE_PROVIDER: provider = 'openai'" in done.stderr
    assert "set REVEILLE_MODEL" in done.stderr


def _serve_refused(env: dict[str, str]) -> str:
    full = {**os.environ, **env}
    for name in ("REVEILLE_CONFIG", "REVEILLE_DATABASE_URL", "API_SERVER_KEY"):
        full.pop(name, None)
    full.update(env)
    done = subprocess.run(
        [sys.executable, "-m", "reveille.cli", "serve", "--port", "0"],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    return done.stderr


def test_errors_found_at_start_name_where_the_value_came_from(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: refused, never tightened
    refused = _serve_refused({"REVEILLE_HOME": str(shared)})
    assert "$REVEILLE_HOME: state directory" in refused
    beyond = {"REVEILLE_HOME": str(tmp_path / "home"), "REVEILLE_HOST": "0.0.0.0"}
    refused = _serve_refused({**beyond, "API_SERVER_KEY": "k", "REVEILLE_WEBUI_PORT": "18787"})
    assert "$REVEILLE_HOST: the web UI would listen on 0.0.0.0" in refused
