"""`reveille --version`: the version with the commit, from the checkout's git, else from the
build's stamp, else "unknown", and never a crash without git."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reveille import build_info, version

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reveille.cli", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_from_a_checkout_the_version_names_the_commit_git_names() -> None:
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    done = _run("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"reveille {version()} (commit {head}")


def test_without_git_the_version_is_still_printed() -> None:
    done = _run("--version", env={"PATH": "/nonexistent"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"reveille {version()} (commit ")
    assert "Traceback" not in done.stderr


def test_an_installed_build_reports_its_stamped_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build_info, "_CHECKOUT", tmp_path)  # no .git beside the package
    monkeypatch.setattr(build_info, "STAMP_FILE", tmp_path / "BUILD_COMMIT")
    assert build_info.version_line() == f"reveille {version()} (commit unknown)"
    (tmp_path / "BUILD_COMMIT").write_text("0123456789abcdef\n")
    assert build_info.version_line() == f"reveille {version()} (commit 0123456789abcdef)"
    (tmp_path / "BUILD_COMMIT").write_bytes(b"\xff\xfe")  # garbage is shown, never raised
    assert build_info.commit() is not None
