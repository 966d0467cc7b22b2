"""Which build of Reveille this is: the version with the git commit (`reveille --version`).

Run from a checkout, the commit is ``git rev-parse`` of that checkout (with ``-dirty`` when
tracked files differ from it). An installed build has no ``.git`` beside it: the commit is
the one stamped into ``reveille/BUILD_COMMIT`` when the wheel was built (the Dockerfile's
``REVEILLE_COMMIT`` build argument does that). Neither there: "commit unknown". Nothing here
raises: a missing ``git``, a broken checkout or an unreadable stamp only make it unknown.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from reveille import version

__all__ = ["STAMP_FILE", "commit", "version_line"]

STAMP_FILE = Path(__file__).with_name("BUILD_COMMIT")
_CHECKOUT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(_CHECKOUT), *args],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None  # no git on this host, or it hung
    return done.stdout.strip() if done.returncode == 0 else None


def _from_checkout() -> str | None:
    # Only the checkout this package lives in: an install inside some other repository's
    # tree (a venv in a project) must not report that project's commit.
    if not (_CHECKOUT / ".git").exists() or not (_CHECKOUT / "pyproject.toml").is_file():
        return None
    head = _git("rev-parse", "--short=12", "HEAD")
    if not head:
        return None
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head}-dirty" if dirty else head


def _stamped() -> str | None:
    try:
        text = STAMP_FILE.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    return text.splitlines()[0][:64] if text and text != "unknown" else None


def commit() -> str | None:
    """The git commit of this build, or None when neither a checkout nor a stamp says."""
    return _from_checkout() or _stamped()


def version_line() -> str:
    """``reveille 0.1.0 (commit 1a2b3c4d5e6f)``, or ``(commit unknown)``."""
    return f"reveille {version()} (commit {commit() or 'unknown'})"
