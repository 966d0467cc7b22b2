"""`reveille serve` in a subprocess, for tests; REVEILLE_TEST_HOLD_ACK holds every ack.

With REVEILLE_TEST_HOLD_ACK=1 the watcher delivers as usual but never acknowledges: it
prints ``HOLDING-ACK <id>`` and waits, so a test can SIGKILL the server between a delivery
and its acknowledgement.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys

# REVEILLE_TEST_HOSTNAME: this server claims to run on another host (its identity names that
# host), so its peers cannot watch its pid and must judge it by its heartbeat.
if os.environ.get("REVEILLE_TEST_HOSTNAME"):
    _host = os.environ["REVEILLE_TEST_HOSTNAME"]
    socket.gethostname = lambda: _host

import tools.async_delegation as ad

if os.environ.get("REVEILLE_TEST_HOLD_ACK"):

    async def _hold(evt, claim):
        row = evt.get("delegation_id") or evt.get("delivery_id")
        print(f"HOLDING-ACK {row}", flush=True)
        await asyncio.sleep(3600)
        return False

    ad.acomplete_event_delivery = _hold

from reveille.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
