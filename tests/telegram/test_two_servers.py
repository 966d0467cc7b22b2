"""Two `reveille serve` processes on one PostgreSQL database sharing one Telegram bot (the fake
Bot API answers the older of two concurrent ``getUpdates`` with 409, as Telegram does): one
polls, the other stands by. Ten messages (four of them start background work) arrive; the
poller, which claims to run on another host, is SIGKILLed in the middle, and the survivor
takes over its lease and its unanswered updates when their leases lapse. Every message is
answered once, every background result delivered once, conflicts stay few, and no
``telegram.db`` (nor ``chats.db``) is created anywhere. In webhook mode an update may
arrive at either server (or both): it is answered once."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path

from gateway.surfaces.telegram.intake import SECRET_HEADER
from tests.api_server.serve_support import Server, ledger_rows, wait_until
from tests.pg_support import fresh_url
from tests.telegram.conftest import telegram_env
from tests.telegram.fake_bot_api import FakeBotApi

PEER_TIMEOUT = 2.0
POLLING = re.compile(r"Telegram: polling for updates")
STANDING_BY = re.compile(r"Telegram: another server polls bot \d+; standing by")


def _server(tmp_path: Path, name: str, url: str, bot: FakeBotApi, **env: str) -> Server:
    home = tmp_path / name
    home.mkdir()
    extra = {
        "REVEILLE_DATABASE_URL": url,
        "REVEILLE_PEER_TIMEOUT_SECONDS": str(PEER_TIMEOUT),
        **telegram_env(bot),
        **env,
    }
    return Server(home, demo_delay=0.3, extra_env=extra)


def _send(bot: FakeBotApi, n: int) -> str:
    """Message ``n``: every third-ish one starts background work; users 42 and 43 alternate."""
    token = f"msg{n:02d}"
    text = f"in the background: {token}" if n in (1, 3, 6, 8) else f"tell me {token}"
    bot.message(text, user_id=42 + n % 2)
    return token


def test_two_servers_share_one_bot_and_survive_the_pollers_death(
    tmp_path: Path, bot: FakeBotApi
) -> None:
    url = fresh_url()
    doomed = _server(tmp_path, "doomed", url, bot, REVEILLE_TEST_HOSTNAME="far-away-host")
    survivor = None
    try:
        doomed.wait_for(POLLING)
        survivor = _server(tmp_path, "survivor", url, bot)
        survivor.wait_for(STANDING_BY)
        bot.hold_sends.set()  # the poller's answers cannot reach the chats before the kill
        tokens = [_send(bot, n) for n in range(5)]
        first_ids = set(range(1001, 1006))
        # In the middle: the first updates were taken, their answers are on their way.
        wait_until(lambda: first_ids <= set(bot.handed_out) and bot.held >= 1)
        doomed.stop(signal.SIGKILL)
        killed_at, killed_wall = time.monotonic(), time.time()
        bot.discard_held = True  # the held sends' client is gone: they never arrive
        bot.hold_sends.clear()
        time.sleep(0.2)
        assert bot.sent == []
        bot.discard_held = False
        tokens += [_send(bot, n) for n in range(5, 10)]

        def all_done() -> bool:
            rows = ledger_rows(url)
            return (
                all(any(t in m.text for m in bot.sent if "finished" not in m.text) for t in tokens)
                and len(rows) == 4
                and all(r.delivery_state == "delivered" for r in rows)
            )

        wait_until(all_done, timeout=90)
        took = time.monotonic() - killed_at
        survivor.wait_for(POLLING)
        time.sleep(2.0)  # nothing more arrives
        with bot._lock:
            sent = list(bot.sent)
        background = {"msg01", "msg03", "msg06", "msg08"}
        for token in tokens:
            answers = [m for m in sent if token in m.text and "finished" not in m.text]
            wakes = [m for m in sent if token in m.text and "finished" in m.text]
            assert len(answers) == 1, (token, [m.text for m in answers])
            assert len(wakes) == (1 if token in background else 0), (token, wakes)
        # Results of one chat that finish together may come home as one combined wake-up.
        wake_messages = [m for m in sent if "finished" in m.text]
        assert len(sent) == 10 + len(wake_messages), [m.text for m in sent]
        taken_over = sum("taken over (its server is gone)" in line for line in survivor.lines)
        assert taken_over >= 1  # the dead poller's updates, answered by the survivor
        with bot._lock:
            polled = [at for name, _, at in bot.calls if name == "getUpdates" and at > killed_wall]
        print(
            f"the survivor polled {polled[0] - killed_wall:.1f} s after the kill; "
            f"all answered {took:.1f} s after the kill; {taken_over} update(s) taken over; "
            f"getUpdates conflicts: {bot.conflicts}; "
            f"getUpdates calls: {len(bot.calls_of('getUpdates'))}"
        )
        assert bot.conflicts <= 3
        made = sorted(p.name for p in tmp_path.rglob("*.db*"))
        assert made == [], made  # the whole state is in the database
    finally:
        for server in (doomed, survivor):
            if server is not None and server.proc.poll() is None:
                server.proc.kill()


def _post(server: Server, update: dict) -> int:
    request = urllib.request.Request(
        f"{server.url}/telegram/hook",
        data=json.dumps(update).encode(),
        method="POST",
        headers={"Content-Type": "application/json", SECRET_HEADER: "hook-secret"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return int(resp.status)


def test_in_webhook_mode_an_update_arriving_at_both_servers_is_answered_once(
    tmp_path: Path, bot: FakeBotApi
) -> None:
    """Telegram retries a webhook POST that timed out, and a load balancer may send the retry
    to the other server: both take it into the shared inbox, one of them answers it."""
    url = fresh_url()
    hook = {
        "TELEGRAM_WEBHOOK_URL": "https://bot.example/telegram/hook",
        "TELEGRAM_SECRET_TOKEN": "hook-secret",
    }
    servers = [_server(tmp_path, name, url, bot, **hook) for name in ("one", "two")]
    try:
        wait_until(lambda: bot.webhook is not None)
        updates = []
        for n in range(6):
            bot.message(f"hooked msg{n:02d}", user_id=42 + n % 2)
            updates.append(bot.updates[-1])
        start = threading.Barrier(2 * len(updates))
        statuses: list[int] = []

        def deliver(server: Server, update: dict) -> None:
            start.wait()
            statuses.append(_post(server, update))

        threads = [
            threading.Thread(target=deliver, args=(server, update))
            for update in updates
            for server in servers
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert statuses == [200] * 12
        wait_until(lambda: len(bot.sent) >= 6)
        time.sleep(1.5)  # nothing more arrives
        for n in range(6):
            answers = [m for m in bot.sent if f"msg{n:02d}" in m.text]
            assert len(answers) == 1, (n, [m.text for m in bot.sent])
        assert len(bot.sent) == 6
        assert bot.calls_of("getUpdates") == []
        assert sorted(p.name for p in tmp_path.rglob("*.db*")) == []
    finally:
        for server in servers:
            server.stop()
