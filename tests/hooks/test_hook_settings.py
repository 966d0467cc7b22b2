"""``[hooks.NAME]`` in the settings file: declared hooks, their route, the knobs of
``[hooks]``, and clear errors for what cannot be used."""

from __future__ import annotations

from pathlib import Path

import pytest

from delivery.inbound import HookRoute
from reveille.settings import SettingsError, load_settings


def _load(tmp_path: Path, text: str, **env: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_settings({"REVEILLE_HOME": str(tmp_path), **env}, config_file=path)


def test_hooks_are_declared_with_an_optional_session(tmp_path: Path) -> None:
    s = _load(
        tmp_path,
        '[hooks]\nlookback_seconds = 60\n[hooks.ci]\nsession = "sess_1"\n[hooks.deploy]\n',
    )
    assert s.hooks == (HookRoute("ci", "sess_1"), HookRoute("deploy", None))
    assert s.hooks_lookback_seconds == 60
    assert s.hooks_rotation_overlap_seconds == 86400
    assert _load(tmp_path, "").hooks == ()
    env = _load(tmp_path, "", REVEILLE_HOOKS_MAX_BODY_BYTES="2048")
    assert env.hooks_max_body_bytes == 2048


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('[hooks."a b"]\n', "a hook name is"),
        ("[hooks.ci]\nsesion = 'x'\n", "unknown setting sesion"),
        ("[hooks.ci]\nsession = 5\n", "a session id"),
        ("[hooks]\nmax_body_bytes = 10\n", "hooks_max_body_bytes"),
        ("[hooks]\nunknown = 1\n", "unknown setting [hooks] unknown"),
    ],
)
def test_bad_hook_settings_are_clear_errors(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(SettingsError, match=error.replace("[", r"\[").replace("]", r"\]")):
        _load(tmp_path, text)
