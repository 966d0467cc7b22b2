"""`[shell] approvals = "always" | "never"`: the setting, what the banner says about it, and
the shell tool refusing a command it cannot ask about."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.tools import ToolContext
from reveille.banner import startup_banner
from reveille.settings import Settings, SettingsError, load_settings
from tools.shell_tool import NO_APPROVAL_ERROR, make_shell_tool


def test_approvals_default_to_always_and_are_set_by_env_or_toml(tmp_path: Path) -> None:
    assert load_settings({"REVEILLE_HOME": str(tmp_path)}).shell_approvals == "always"
    env = {"REVEILLE_HOME": str(tmp_path), "REVEILLE_SHELL_APPROVALS": "never"}
    assert load_settings(env).shell_approvals == "never"
    config = tmp_path / "config.toml"
    config.write_text('[shell]\nenabled = true\napprovals = "never"\n')
    settings = load_settings({"REVEILLE_HOME": str(tmp_path)}, config_file=config)
    assert settings.shell_enabled and not settings.shell_asks
    with pytest.raises(SettingsError, match="shell_approvals"):
        load_settings({"REVEILLE_HOME": str(tmp_path), "REVEILLE_SHELL_APPROVALS": "sometimes"})


def test_the_banner_says_plainly_when_commands_run_unasked(tmp_path: Path) -> None:
    def banner(**kw: object) -> str:
        return startup_banner(Settings(home=tmp_path, **kw), port=8642, model="m", restored=0)  # type: ignore[arg-type]

    assert "shell tool: off" in banner()
    asks = banner(shell_enabled=True)
    assert "waits for a person's approval" in asks and "WITHOUT" not in asks
    unasked = banner(shell_enabled=True, shell_approvals="never")
    assert "ENABLED WITHOUT APPROVALS" in unasked
    assert "runs any command" in unasked


async def test_a_command_without_a_way_to_ask_is_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    tool = make_shell_tool(enabled=True, workdir=str(tmp_path), require_approval=True)
    result = await tool.handler({"command": f"touch {marker}"}, ToolContext(session_id="s"))
    assert result == {"error": NO_APPROVAL_ERROR, "denied": True}
    assert not marker.exists()

    async def yes(command: str) -> bool:
        return True

    result = await tool.handler({"command": f"touch {marker}"}, ToolContext(confirm=yes))
    assert "error" not in result and marker.exists()
