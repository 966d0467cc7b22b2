"""A server's webhook sender in a process of its own, for the SIGKILL test.

Usage: webhook_child.py LEDGER_PATH URL SECRET N

Runs a ``WebhookSender`` (lease 1 s) on the SQLite store at LEDGER_PATH, enqueues N
``response.completed`` events (``resp_0`` .. ``resp_{N-1}``) unless N is 0, prints
``ENQUEUED`` once they are durable (one os.write, so the parent never reads a line whose step
had not returned), then sends until it is killed.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import storage
from gateway.webhooks import WebhookPolicy, WebhookSender

POLICY = WebhookPolicy(
    first_retry_seconds=0.05,
    max_retry_seconds=0.2,
    timeout_seconds=30.0,
    lease_seconds=1.0,
    poll_seconds=0.2,
    breaker_open_seconds=0.05,
)


async def main() -> None:
    path, url, secret, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    backend = storage.sqlite_files(ledger=path).open_webhooks()
    sender = WebhookSender(
        backend, [url], secret=secret, consumer=f"child-{os.getpid()}", policy=POLICY
    )
    for i in range(count):
        await sender.aenqueue("response.completed", f"resp_{i}")
    os.write(1, b"ENQUEUED\n")
    await sender.start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
