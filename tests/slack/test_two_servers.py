"""Two `reveille serve` processes on one PostgreSQL database sharing one Slack app.

Socket Mode: one server holds the consumer lease and the socket, the other stands by. Messages
(two of them start background work) arrive; the socket's holder, which claims to run on
another host, is SIGKILLed while its answers are on their way; the survivor takes over the
lease (a socket of its own) and the events the dead server had taken, when their claims
lapse. Every message is answered once, every background result delivered once.

The Events API: Slack re-sends an event that timed out and a load balancer may send it to the
other server: both take it into the shared inbox, one of them answers it.

A button press that reaches the other server than the turn waiting for it is decided through
the shared store; one acknowledged (stored) by a server SIGKILLed before it decided is taken
over and decided by the survivor, once.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest

from gateway.surfaces.slack.http import sign
from tests.api_server.serve_support import Server, ledger_rows, wait_until
from tests.pg_support import fresh_url
from tests.surfaces.slack_fake import FakeSlack, dm_channel, visible

OWNER, OTHER = "U0OWNER", "U0OTHER"
HOLDING = re.compile(r"Slack: holding the Socket Mode lease")
STANDING_BY = re.compile(r"Slack: another server holds the Socket Mode lease; standing by")


@pytest.fixture
def fake() -> Iterator[FakeSlack]:
    slack = FakeSlack()
    yield slack
    slack.stop()


def _server(tmp_path: Path, name: str, url: str, fake: FakeSlack, **env: str) -> Server:
    home = tmp_path / name
    home.mkdir()
    extra = {
        "REVEILLE_DATABASE_URL": url,
        "REVEILLE_PEER_TIMEOUT_SECONDS": "2.0",
        "SLACK_BOT_TOKEN": fake.bot_token,
        "SLACK_BASE_URL": fake.base_url,
        "SLACK_ALLOWED_USERS": f"{OWNER},{OTHER}",
        **env,
    }
    return Server(home, demo_delay=0.3, extra_env=extra)


def _answers(fake: FakeSlack, token: str) -> list[str]:
    texts = [visible(s.text) for u in (OWNER, OTHER) for s in fake.messages_to(dm_channel(u))]
    return [t for t in texts if token in t and "finished" not in t]


def test_the_socket_moves_to_the_survivor_and_every_message_is_answered_once(
    tmp_path: Path, fake: FakeSlack
) -> None:
    url = fresh_url()
    socket = {"SLACK_APP_TOKEN": fake.app_token}
    doomed = _server(
        tmp_path, "doomed", url, fake, REVEILLE_TEST_HOSTNAME="far-away-host", **socket
    )
    survivor = None
    try:
        doomed.wait_for(HOLDING)
        wait_until(lambda: fake.hellos >= 1)
        survivor = _server(tmp_path, "survivor", url, fake, **socket)
        survivor.wait_for(STANDING_BY)
        fake.holding = True  # the holder's answers cannot reach the chats before the kill
        tokens = []
        for n in range(4):
            token = f"msg{n:02d}"
            text = f"in the background: {token}" if n in (1, 3) else f"tell me {token}"
            fake.say(text, user=(OWNER, OTHER)[n % 2])
            tokens.append(token)
        wait_until(lambda: len(fake.acked) >= 4 and fake.held >= 1)
        doomed.stop(signal.SIGKILL)
        fake.discard_held = True
        fake.holding = False
        time.sleep(0.2)
        assert fake.sent == []
        fake.discard_held = False
        for n in range(4, 6):
            token = f"msg{n:02d}"
            fake.say(f"tell me {token}", user=OWNER)
            tokens.append(token)

        def all_done() -> bool:
            rows = ledger_rows(url)
            return (
                all(_answers(fake, t) for t in tokens)
                and len(rows) == 2
                and all(r.delivery_state == "delivered" for r in rows)
            )

        wait_until(all_done, timeout=90)
        survivor.wait_for(HOLDING)
        time.sleep(2.0)  # nothing more arrives
        for token in tokens:
            assert len(_answers(fake, token)) == 1, (token, _answers(fake, token))
        assert all(r.delivery_attempts == 1 for r in ledger_rows(url))
        assert fake.hellos == 2  # one socket at a time: the holder's
        taken_over = sum("taken over (its server is gone)" in line for line in survivor.lines)
        assert taken_over >= 1
    finally:
        for server in (doomed, survivor):
            if server is not None and server.proc.poll() is None:
                server.proc.kill()


def _post(
    server: Server,
    secret: str,
    body: bytes,
    retry: str | None,
    *,
    path: str = "/slack/events",
    content_type: str = "application/json",
) -> int:
    stamp = str(int(time.time()))
    headers = {
        "Content-Type": content_type,
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": sign(secret, stamp, body),
    }
    if retry:
        headers["X-Slack-Retry-Num"] = retry
    request = urllib.request.Request(
        f"{server.url}{path}", data=body, method="POST", headers=headers
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return int(resp.status)


def test_an_event_arriving_at_both_servers_is_answered_once(
    tmp_path: Path, fake: FakeSlack
) -> None:
    url = fresh_url()
    events = {"SLACK_SIGNING_SECRET": fake.signing_secret}
    servers = [_server(tmp_path, name, url, fake, **events) for name in ("one", "two")]
    try:
        bodies = [
            json.dumps(fake.message_envelope(f"hooked msg{n:02d}", user=OWNER)).encode()
            for n in range(4)
        ]
        start = threading.Barrier(2 * len(bodies))
        statuses: list[int] = []

        def deliver(server: Server, body: bytes, retry: str | None) -> None:
            start.wait()
            statuses.append(_post(server, fake.signing_secret, body, retry))

        threads = [
            threading.Thread(target=deliver, args=(server, body, retry))
            for body in bodies
            for server, retry in zip(servers, (None, "1"), strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert statuses == [200] * len(threads)
        wait_until(lambda: all(_answers(fake, f"msg{n:02d}") for n in range(4)), timeout=60)
        time.sleep(1.5)
        for n in range(4):
            assert len(_answers(fake, f"msg{n:02d}")) == 1
    finally:
        for server in servers:
            server.stop()


def test_a_press_stored_by_a_server_killed_before_deciding_is_decided_by_the_survivor(
    tmp_path: Path, fake: FakeSlack
) -> None:
    url = fresh_url()
    env = {
        "SLACK_SIGNING_SECRET": fake.signing_secret,
        "REVEILLE_SHELL_ENABLED": "1",
        "REVEILLE_SHELL_APPROVALS": "always",
    }
    asking = _server(tmp_path, "asking", url, fake, **env)
    doomed = _server(tmp_path, "doomed", url, fake, **env)
    secret = fake.signing_secret
    try:
        body = json.dumps(fake.message_envelope("run in the background: echo pressed", user=OWNER))
        assert _post(asking, secret, body.encode(), None) == 200

        def question() -> Any:
            return [s for s in fake.messages_to(dm_channel(OWNER)) if s.blocks]

        [asked] = wait_until(question, timeout=30)
        payload = fake.press_payload(asked, "reveille_approve", by=OWNER)
        form = urlencode({"payload": json.dumps(payload)}).encode()
        # The press reaches the other server, which stores it and is answered 200, then cannot
        # decide it (its write on the approval waits on this lock) before it is SIGKILLed.
        with psycopg.connect(url) as lock:
            lock.execute("SELECT id FROM approvals FOR UPDATE")
            content_type = "application/x-www-form-urlencoded"
            status = _post(
                doomed, secret, form, None, path="/slack/interactivity", content_type=content_type
            )
            assert status == 200

            def waiting() -> bool:
                with psycopg.connect(url, autocommit=True) as look:
                    rows = look.execute(
                        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND query ILIKE %s",
                        ("%approvals%",),
                    ).fetchall()
                return bool(rows)

            wait_until(waiting, timeout=30)
            doomed.stop(signal.SIGKILL)
            # Its database session dies with it: the write it was waiting for never happens.
            with psycopg.connect(url, autocommit=True) as look:
                look.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query ILIKE %s",
                    ("%approvals%",),
                )
            assert fake.ephemeral == []
            lock.rollback()
        replies = lambda: [visible(s.text) for s in fake.messages_to(dm_channel(OWNER))]  # noqa: E731
        wait_until(lambda: any("Result: pressed" in r for r in replies()), timeout=60)
        time.sleep(1.5)  # nothing more arrives
        assert fake.ephemeral == [(OWNER, "Approved.")]
        assert sum("Result: pressed" in r for r in replies()) == 1
        assert any("taken over (its server is gone)" in line for line in asking.lines)
    finally:
        for server in (asking, doomed):
            if server.proc.poll() is None:
                server.proc.kill()
