"""What `reveille serve` tells its operator in the log: a background process's start and end
(with its id, pid, session and outcome), and a shutdown (why, what it waited for, how long).
Work recovered from a dead server is logged by the ledger (tests/delivery/test_ledger.py)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from tests.api_server.serve_support import Server, chat


def test_a_background_process_and_the_shutdown_are_logged(tmp_path: Path) -> None:
    server = Server(tmp_path)
    try:
        session, reply = chat(server.port, "run in the background: echo logged\ntrue")
        proc = re.search(r"proc_[0-9a-f]+", reply)
        assert proc, reply
        started = server.wait_for(
            re.compile(rf"background process {proc.group()} started: pid (\d+), session (\S+),")
        )
        assert started.group(2) == session
        line = next(x for x in server.lines if "started: pid" in x)
        assert "command 'echo logged\\ntrue'" in line  # one line, whatever it holds
        server.wait_for(
            re.compile(
                rf"background process {proc.group()} ended: completed, exit code 0, "
                r"after [\d.]+ s"
            )
        )
        assert server.stop(signal.SIGTERM) == 0
        server.wait_for(re.compile(r"stopping on SIGTERM: \d+ API turn\(s\) running"))
        server.wait_for(re.compile(r"drained background work in [\d.]+ s"))
        server.wait_for(re.compile(r"stopped in [\d.]+ s"))
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
