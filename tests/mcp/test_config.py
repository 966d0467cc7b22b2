"""``[mcp.servers.NAME]`` in the settings file: stdio and HTTP servers, ``${ENV}`` values from
the environment (never shown), include/exclude globs, and clear errors for bad tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from reveille.settings import SettingsError, load_settings
from tools.mcp.config import McpServerConfig


def settings_with(tmp_path: Path, toml: str, **env: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "config.toml"
    path.write_text(toml)
    return load_settings({"REVEILLE_HOME": str(tmp_path), **env}, config_file=path)


def test_servers_load_with_secrets_from_the_environment(tmp_path: Path) -> None:
    settings = settings_with(
        tmp_path,
        """
[mcp.servers.files]
command = ["npx", "server-files", "${FILES_ROOT}"]
env = { TOKEN = "${FILES_TOKEN}" }
exclude = ["delete_*"]

[mcp.servers.api]
url = "https://mcp.example/mcp"
headers = { Authorization = "Bearer ${API_TOKEN}" }
approvals = "always"
timeout_seconds = 5
""",
        FILES_ROOT="/srv",
        FILES_TOKEN="s3cret-files",
        API_TOKEN="s3cret-api",
    )
    files, api = settings.mcp_servers
    assert files.command == ("npx", "server-files", "/srv")
    assert files.env == {"TOKEN": "s3cret-files"} and files.transport == "stdio"
    assert files.approvals == "unless_read_only" and files.toolset == "mcp:files"
    assert api.headers == {"Authorization": "Bearer s3cret-api"} and api.transport == "http"
    assert api.approvals == "always" and api.timeout_seconds == 5
    assert settings.asks_approvals
    # Secrets never show in a repr (logs, tracebacks).
    assert "s3cret" not in repr(settings) and "s3cret" not in repr(settings.mcp_servers)


def test_a_missing_variable_is_named_never_a_value(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"headers.Authorization names \$\{NOPE\}"):
        settings_with(
            tmp_path,
            '[mcp.servers.api]\nurl = "http://x/mcp"\nheaders = { Authorization = "${NOPE}" }\n',
        )


@pytest.mark.parametrize(
    ("toml", "why"),
    [
        ("[mcp.servers.a]\nenv = {}\n", "either command"),
        ('[mcp.servers.a]\ncommand = ["x"]\nurl = "http://x"\n', "either command"),
        ('[mcp.servers.a]\nurl = "ftp://x"\n', "http"),
        ('[mcp.servers.a]\ncommand = ["x"]\napprovals = "sometimes"\n', "approvals"),
        ('[mcp.servers.a]\ncommand = ["x"]\ntimeout_seconds = 0\n', "timeout_seconds"),
        ('[mcp.servers.a]\ncommand = ["x"]\ncolour = "red"\n', "unknown key"),
        ('[mcp.servers.a__b]\ncommand = ["x"]\n', "server name"),
        ('[mcp.servers.a]\ncommand = "x"\n', "list of strings"),
        ("[mcp]\nfoo = 1\n", "only"),
    ],
)
def test_bad_tables_say_where_and_why(tmp_path: Path, toml: str, why: str) -> None:
    with pytest.raises(SettingsError, match=why) as caught:
        settings_with(tmp_path, toml)
    assert "[mcp" in str(caught.value)


def test_include_and_exclude_globs() -> None:
    config = McpServerConfig(name="x", command=("x",), include=("s*", "p?d"), exclude=("slow",))
    taken = [t for t in ("say", "slow", "pid", "note", "paid") if config.takes(t)]
    assert taken == ["say", "pid"]
    assert McpServerConfig(name="x", command=("x",)).takes("anything")


def test_approval_modes() -> None:
    default = McpServerConfig(name="x", command=("x",))
    assert default.asks(read_only=False) and not default.asks(read_only=True)
    always = McpServerConfig(name="x", command=("x",), approvals="always")
    assert always.asks(read_only=True)
    never = McpServerConfig(name="x", command=("x",), approvals="never")
    assert not never.asks(read_only=False)
