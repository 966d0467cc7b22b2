"""`reveille hooks`: a secret printed once per call (a new one each time: a rotation), a
bad name refused, and `list` on a fresh state directory creating nothing."""

from __future__ import annotations

from pathlib import Path

from tests.hooks.test_serve_hooks import _reveille


def test_list_on_a_fresh_home_creates_no_store(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('[hooks.ci]\nsession = "s1"\n')
    listed = _reveille(tmp_path, "hooks", "list")
    assert listed.returncode == 0, listed.stderr
    assert "ci" in listed.stdout and "session s1" in listed.stdout and "none" in listed.stdout
    assert not (tmp_path / "ledger.db").exists()


def test_secret_creates_then_rotates_and_refuses_a_bad_name(tmp_path: Path) -> None:
    first = _reveille(tmp_path, "hooks", "secret", "deploy")
    assert first.returncode == 0 and first.stdout.startswith("whsec_")
    assert "no [hooks.deploy] in the settings" in first.stderr  # told it answers 404 yet
    second = _reveille(tmp_path, "hooks", "secret", "deploy")
    assert second.returncode == 0 and second.stdout != first.stdout
    assert "rotated" in second.stderr
    assert (tmp_path / "ledger.db").stat().st_mode & 0o077 == 0  # the secrets' file is private
    listed = _reveille(tmp_path, "hooks", "list")
    assert "not declared" in listed.stdout and "old one until" in listed.stdout
    assert first.stdout.strip() not in listed.stdout  # never shown again
    bad = _reveille(tmp_path, "hooks", "secret", "../etc")
    assert bad.returncode == 2 and "hook name" in bad.stderr
