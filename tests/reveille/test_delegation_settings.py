"""The sub-agent settings ([delegation] max_depth, max_steps, stall_seconds): read from the
file and the environment, refused when unusable, and wired into the agent's delegate_task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.providers.demo import DemoModel
from agent.tools import ToolContext
from reveille.app import build_agent
from reveille.settings import SettingsError, load_settings


def test_defaults_file_and_environment(tmp_path: Path) -> None:
    s = load_settings({"REVEILLE_HOME": str(tmp_path)})
    assert (s.delegation_max_depth, s.delegation_max_steps, s.delegation_stall_seconds) == (
        1,
        20,
        300.0,
    )
    (tmp_path / "config.toml").write_text(
        "[delegation]\nmax_depth = 2\nmax_steps = 5\nstall_seconds = 30\n"
    )
    s = load_settings({"REVEILLE_HOME": str(tmp_path), "REVEILLE_DELEGATION_STALL_SECONDS": "7.5"})
    assert (s.delegation_max_depth, s.delegation_max_steps, s.delegation_stall_seconds) == (
        2,
        5,
        7.5,
    )
    s = load_settings({"REVEILLE_HOME": str(tmp_path), "REVEILLE_DELEGATION_MAX_DEPTH": "3"})
    assert s.delegation_max_depth == 3


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REVEILLE_DELEGATION_MAX_DEPTH": "0"}, "delegation_max_depth"),
        ({"REVEILLE_DELEGATION_MAX_STEPS": "0"}, "delegation_max_steps"),
        ({"REVEILLE_DELEGATION_STALL_SECONDS": "0"}, "delegation_stall_seconds"),
        ({"REVEILLE_DELEGATION_MAX_DEPTH": "deep"}, r"\$REVEILLE_DELEGATION_MAX_DEPTH"),
    ],
)
def test_unusable_values_are_refused(tmp_path: Path, env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings({"REVEILLE_HOME": str(tmp_path), **env})


@pytest.mark.parametrize(("depth", "may_delegate"), [("1", False), ("2", True)])
async def test_the_agent_gets_the_depth_limit(tmp_path: Path, depth: str, may_delegate: bool):
    settings = load_settings(
        {"REVEILLE_HOME": str(tmp_path), "REVEILLE_DELEGATION_MAX_DEPTH": depth}
    )
    agent = build_agent(settings, DemoModel(delay_seconds=0))
    raw = await agent.registry.call(
        "delegate_task",
        json.dumps({"goal": "g", "toolsets": ["delegation"]}),
        ToolContext(session_id="s"),
    )
    if may_delegate:
        assert raw == "Done: g. (demo sub-agent result)"
    else:
        assert "cannot delegate further" in json.loads(raw)["error"]
