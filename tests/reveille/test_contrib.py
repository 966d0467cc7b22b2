"""The service files in contrib/: the systemd unit verifies, and its stop timeout leaves
room for the drain."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reveille.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "contrib" / "systemd" / "reveille.service"


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    # The unit names where the README installs Reveille; verify checks that the program
    # exists, so this copy names the one running the tests.
    reveille = Path(sys.executable).with_name("reveille")
    text = UNIT.read_text().replace("/opt/reveille/bin/reveille", str(reveille))
    copy = tmp_path / "reveille.service"
    copy.write_text(text)
    done = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def test_the_unit_waits_longer_than_the_drain_before_killing() -> None:
    text = UNIT.read_text()
    stop = int(re.search(r"^TimeoutStopSec=(\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
    grace = 10  # the turns' shutdown grace (reveille.app.serve)
    assert stop > Settings().drain_seconds + grace
    assert re.search(r"^KillSignal=SIGTERM$", text, re.M)
    # Background shell commands outlive a restart and are adopted by the next server.
    assert re.search(r"^KillMode=process$", text, re.M)
