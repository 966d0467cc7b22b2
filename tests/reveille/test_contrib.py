"""The service files in contrib/: the systemd unit verifies, and its stop timeout leaves
room for the drain."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
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


def test_the_image_builds_from_every_package_the_wheel_holds() -> None:
    """The Dockerfile copies, and .dockerignore lets through, every package pyproject.toml
    puts in the wheel (a package added later must not be left out of the image)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) \./\1$", dockerfile, re.M))
    assert copied == packages
    allowed = set(re.findall(r"^!(\w+)/$", (ROOT / ".dockerignore").read_text(), re.M))
    assert allowed == packages
    assert re.search(r"^USER reveille$", dockerfile, re.M)  # never root
    assert "/readyz" in dockerfile.split("HEALTHCHECK", 1)[1]
