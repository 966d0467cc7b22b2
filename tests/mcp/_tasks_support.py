"""The tests' task-capable MCP server (``task_server.py``) as a subprocess serving streamable
HTTP on a free loopback port, so it outlives a Reveille server the test kills; and what its
log says reached it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port
from tools.mcp.config import McpServerConfig

TASK_SCRIPT = Path(__file__).with_name("task_server.py")


@dataclass(frozen=True)
class TaskServer:
    url: str
    log: Path

    def config(self, name: str = "tasks") -> McpServerConfig:
        return McpServerConfig(name=name, url=self.url)

    def toml(self, name: str = "tasks") -> str:
        return f'[mcp.servers.{name}]\nurl = "{self.url}"\n'

    def lines(self, word: str) -> list[str]:
        """The log's lines that start with ``word`` (``created``, ``cancelled`` ...)."""
        if not self.log.exists():
            return []
        return [line for line in self.log.read_text().splitlines() if line.startswith(word)]


@contextmanager
def task_server(tmp: Path) -> Iterator[TaskServer]:
    port = free_port()
    log = tmp / "task-server.log"
    proc = subprocess.Popen([sys.executable, str(TASK_SCRIPT), str(port), str(log)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("the task server did not start") from None
                time.sleep(0.05)
        yield TaskServer(f"http://127.0.0.1:{port}/mcp", log)
    finally:
        proc.kill()
        proc.wait()
