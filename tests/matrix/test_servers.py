"""Two `reveille serve` processes on one store share one Matrix bot: one of them syncs (a
lease in the store), a message is answered once, and when one is SIGKILLed the other
answers what comes next (taking the lease over when the dead one held it)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.api_server.serve_support import Server, wait_until
from tests.surfaces.matrix_fake import MatrixPlatform


def test_two_servers_share_the_bot_and_one_takes_over(tmp_path: Path) -> None:
    platform = MatrixPlatform()
    servers = [Server(tmp_path, extra_env=platform.env()) for _ in range(2)]
    try:
        platform.say("first question")
        wait_until(lambda: any("first question" in t for t in platform.replies()), timeout=30)
        time.sleep(1.5)
        assert len(platform.replies()) == 1, platform.replies()
        # One of them dies; whether it held the lease or not, the other one answers next.
        servers[0].stop(signal.SIGKILL)
        platform.say("second question")
        wait_until(lambda: any("second question" in t for t in platform.replies()), timeout=60)
        time.sleep(1.5)
        assert len(platform.replies()) == 2, platform.replies()
    finally:
        for server in servers:
            server.stop()
        platform.stop()
