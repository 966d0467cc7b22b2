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

# REVEILLE_TEST_NOFILE=N: the server runs under an open-file limit of N, soft and hard.
if os.environ.get("REVEILLE_TEST_NOFILE"):
    import resource

    _nofile = int(os.environ["REVEILLE_TEST_NOFILE"])
    resource.setrlimit(resource.RLIMIT_NOFILE, (_nofile, _nofile))

# REVEILLE_TEST_FD_HOG=1: SIGUSR1 takes every free descriptor (EMFILE for whatever the server
# opens next: accepted connections, files) and prints HOGGED <n>; SIGUSR2 gives them back
# and prints RELEASED.
if os.environ.get("REVEILLE_TEST_FD_HOG"):
    import signal

    _hogged: list[int] = []

    def _hog(signum, frame):
        while True:
            try:
                _hogged.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        os.write(1, f"HOGGED {len(_hogged)}\n".encode())

    def _release(signum, frame):
        while _hogged:
            os.close(_hogged.pop())
        os.write(1, b"RELEASED\n")

    signal.signal(signal.SIGUSR1, _hog)
    signal.signal(signal.SIGUSR2, _release)

# REVEILLE_TEST_DIE_BEFORE_HOOK=1: the server SIGKILLs itself when a response's terminal hook
# is called, i.e. after its terminal state is stored and before its webhook is owed (prints
# DYING-BEFORE-HOOK <id> first).
if os.environ.get("REVEILLE_TEST_DIE_BEFORE_HOOK"):
    import signal

    import gateway.webhooks

    def _die(self, response_id, event_type):
        print(f"DYING-BEFORE-HOOK {response_id}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    gateway.webhooks.WebhookSender.on_terminal = _die

# REVEILLE_TEST_HOOK_RETRY_SECONDS=S: the responses sweep re-offers a terminal hook left
# unrun S seconds after the response ended (30 s otherwise), checking at every sweep.
if os.environ.get("REVEILLE_TEST_HOOK_RETRY_SECONDS"):
    import gateway.responses

    gateway.responses._HOOK_RETRY_AFTER_SECONDS = float(
        os.environ["REVEILLE_TEST_HOOK_RETRY_SECONDS"]
    )
    gateway.responses._HOOK_CHECK_EVERY_SECONDS = 0.0

# REVEILLE_TEST_WEBHOOK_LEASE_SECONDS=S: webhook claims last S seconds (60 otherwise), so a
# dead server's claimed webhook is sent again soon; retries and polls are quick too.
if os.environ.get("REVEILLE_TEST_WEBHOOK_LEASE_SECONDS"):
    import reveille.app
    from gateway.webhooks import WebhookPolicy, WebhookSender

    _lease = float(os.environ["REVEILLE_TEST_WEBHOOK_LEASE_SECONDS"])

    class _ShortLeaseSender(WebhookSender):
        def __init__(self, *args, **kwargs):
            kwargs["policy"] = WebhookPolicy(
                first_retry_seconds=0.2,
                timeout_seconds=_lease / 2,
                lease_seconds=_lease,
                poll_seconds=0.5,
                breaker_open_seconds=0.2,
            )
            super().__init__(*args, **kwargs)

    reveille.app.WebhookSender = _ShortLeaseSender

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
