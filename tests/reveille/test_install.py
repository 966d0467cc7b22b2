"""Reveille installed from its built wheel, outside the checkout, serves from any directory.

The wheel is built from this checkout (``pip wheel``), installed into a fresh virtual
environment (its dependencies from pip's cache or index: without either, these tests skip
and say so), and ``reveille serve`` is started from an empty directory elsewhere, with a
state directory of its own and nothing of the checkout on its path. It must serve the web
UI's page and files (package data) and the API, answering with the demo model.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "api" / "static"
KEY = "install-test-key"
BUILD_CONTEXT = (
    "pyproject.toml",
    "README.md",
    "agent",
    "api",
    "delivery",
    "gateway",
    "reveille",
    "storage",
    "tools",
)
LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)/v1")
WEBUI = re.compile(r"web UI: http://127\.0\.0\.1:(\d+)/")
# What pip says when it cannot reach an index and has nothing cached.
OFFLINE = re.compile(
    r"No matching distribution|Could not find a version|NewConnectionError|"
    r"Failed to establish a new connection|Temporary failure in name resolution|"
    r"Network is unreachable|ProxyError",
)


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path

    @property
    def reveille(self) -> Path:
        return self.venv / "bin" / "reveille"


def _pip(args: list[str], what: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        output = done.stdout + done.stderr
        if offline := OFFLINE.search(output):
            pytest.skip(
                f"{what} needs packages pip cannot reach (offline, no cache): {offline.group(0)}"
            )
        pytest.fail(f"{what} failed:\n{output[-4000:]}")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("install")
    # Built from a copy holding only what the Dockerfile's build stage copies: the build
    # needs nothing else, and writes nothing into the checkout.
    source = base / "src"
    source.mkdir()
    for name in BUILD_CONTEXT:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(ROOT / name, source / name)
    dist = base / "dist"
    _pip(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(dist)],
        "building the wheel",
    )
    [wheel] = dist.glob("reveille-*.whl")
    env_dir = base / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    _pip([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], "pip install")
    return Installed(wheel, env_dir)


def test_the_wheel_holds_every_file_the_web_ui_serves(installed: Installed) -> None:
    in_checkout = {
        p.relative_to(ROOT).as_posix()
        for p in STATIC.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    with zipfile.ZipFile(installed.wheel) as wheel:
        in_wheel = {n for n in wheel.namelist() if n.startswith("api/static/")}
    assert in_checkout and in_wheel == in_checkout


class Served:
    """``reveille serve`` from the installed environment, its output collected."""

    def __init__(self, installed: Installed, cwd: Path, home: Path) -> None:
        self.webui_port = free_port()
        env = {
            # Nothing of the checkout or of the test's environment: PATH and locale only.
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOME": str(home),
            "REVEILLE_HOME": str(home / "state"),
            "REVEILLE_WEBUI_PORT": str(self.webui_port),
            "REVEILLE_DEMO_DELAY_SECONDS": "0",
            "API_SERVER_KEY": KEY,
            "PYTHONUNBUFFERED": "1",
        }
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [str(installed.reveille), "serve", "--port", "0"],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def ports(self, timeout: float = 60) -> tuple[int, int]:
        """The API's and the web UI's ports, once the banner says both listen."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = "".join(self.lines)
            api, webui = LISTENING.search(text), WEBUI.search(text)
            if api and webui:
                return int(api.group(1)), int(webui.group(1))
            assert self.proc.poll() is None, text
            time.sleep(0.05)
        raise AssertionError("reveille serve did not start:\n" + "".join(self.lines))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


@pytest.fixture
def served(installed: Installed, tmp_path: Path) -> Iterator[Served]:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    server = Served(installed, elsewhere, tmp_path)
    yield server
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait()


def fetch(url: str, body: dict | None = None) -> tuple[int, str, bytes]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, response.headers.get("Content-Type", ""), response.read()


def test_reveille_serve_from_another_directory_serves_the_web_ui_and_the_api(
    installed: Installed, served: Served
) -> None:
    api_port, webui_port = served.ports()
    assert webui_port == served.webui_port
    try:
        check_serving(f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{webui_port}")
    except Exception as exc:
        raise AssertionError(f"{exc!r}; the server said:\n{''.join(served.lines)}") from exc
    assert served.stop() == 0, "".join(served.lines)
    # It ran the installed package, not this checkout's files.
    where = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c", "import api, reveille; print(api.__file__)"],
        cwd=installed.venv,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ.get("PATH", "")},
    ).stdout
    assert Path(where.strip()).is_relative_to(installed.venv)


def check_serving(api: str, webui: str) -> None:
    """The web UI's page and files (package data), the models and a demo completion."""
    status, kind, page = fetch(webui + "/")
    assert status == 200 and kind.startswith("text/html")
    assert page == (STATIC / "index.html").read_bytes()
    status, kind, script = fetch(webui + "/static/app.js")
    assert status == 200 and "javascript" in kind
    assert script == (STATIC / "app.js").read_bytes()
    status, _, vendored = fetch(webui + "/static/vendor/marked/marked.esm.js")
    assert status == 200 and vendored == (STATIC / "vendor/marked/marked.esm.js").read_bytes()

    status, _, models = fetch(api + "/v1/models")
    assert status == 200
    assert [m["id"] for m in json.loads(models)["data"]] == ["reveille-demo"]
    status, _, answer = fetch(
        api + "/v1/chat/completions",
        {"model": "reveille-demo", "messages": [{"role": "user", "content": "hello"}]},
    )
    assert status == 200
    completion = json.loads(answer)
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"]["content"]
