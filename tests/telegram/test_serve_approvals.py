"""`reveille serve` with Telegram and approvals on (the default), against the fake Bot API:
a pending approval gates a background command's wake-up, and survives a crash (kill -9):
the old keyboard's press is answered "expired" and the record is settled, the message is
asked again, and its approval then runs the command once."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.api_server.serve_support import ledger_rows, wait_until
from tests.stores import session_file_store
from tests.telegram.conftest import serve
from tests.telegram.fake_bot_api import FakeBotApi, Sent

ALWAYS = {"REVEILLE_SHELL_APPROVALS": "always"}


def keyboard(bot: FakeBotApi, seen: set[int]) -> Sent:
    """The next message with buttons the bot sends (not one of ``seen``)."""
    found = wait_until(
        lambda: [m for m in bot.keyboards_to(42) if m.message_id not in seen], timeout=30
    )[0]
    seen.add(found.message_id)
    return found


def data(sent: Sent, label: str) -> str:
    rows = sent.reply_markup["inline_keyboard"] if sent.reply_markup else []
    return next(b["callback_data"] for row in rows for b in row if b["text"] == label)


def test_a_pending_approval_gates_a_wake_up(tmp_path: Path, bot: FakeBotApi):
    server = serve(tmp_path, bot, **ALWAYS)
    try:
        seen: set[int] = set()
        bot.message("run in the background: sleep 2; echo first-done")
        first = keyboard(bot, seen)
        bot.press(first.message_id, data(first, "Approve once"))
        wait_until(lambda: any("Started <code>sleep 2" in t for t in bot.texts_to(42)), timeout=30)
        # A second command waits for its approval while the first one finishes.
        bot.message("run in the background: echo second")
        second = keyboard(bot, seen)

        def first_row():
            rows = [r for r in ledger_rows(tmp_path) if "first-done" in (r.goal or "")]
            return rows[0] if rows and rows[0].completed_at else None

        row = wait_until(first_row, timeout=30)
        # Its wake-up was offered and waits, claimed, behind the approval: not delivered.
        wait_until(lambda: first_row().claim_consumer, timeout=30)
        assert first_row().delivery_state == "pending"
        assert not any("first-done" in t and "exit" in t.lower() for t in bot.texts_to(42))
        bot.press(second.message_id, data(second, "Approve once"))
        wait_until(lambda: first_row().delivery_state == "delivered", timeout=60)
        assert first_row().delivery_attempts == 1
        assert row.id == first_row().id
    finally:
        server.stop()


def test_a_pending_approval_survives_a_crash(tmp_path: Path, bot: FakeBotApi):
    server = serve(tmp_path, bot, **ALWAYS)
    try:
        seen: set[int] = set()
        bot.message("run in the background: echo after-restart")
        old = keyboard(bot, seen)
    finally:
        server.stop(signal.SIGKILL)
    store = session_file_store(tmp_path / "sessions.db")
    try:
        [pending_id] = [d.split(":")[1] for d in [data(old, "Approve once")]]
        assert store.get_approval(pending_id).status == "pending"  # as the crash left it
    finally:
        store.close()
    server = serve(tmp_path, bot, **ALWAYS)
    try:
        # The unanswered message is answered again: its command is asked again.
        new = keyboard(bot, seen)
        assert data(new, "Approve once") != data(old, "Approve once")
        # A press on the keyboard of before the crash: the restarted turn's takeover of
        # the session settled it as denied; the press says so and nothing runs.
        bot.press(old.message_id, data(old, "Approve once"))
        wait_until(lambda: bot.answers(), timeout=30)
        assert bot.answers()[0].startswith("Already decided: denied")
        bot.press(new.message_id, data(new, "Approve once"))
        wait_until(lambda: len(bot.answers()) == 2, timeout=30)
        assert bot.answers()[1] == "Approved."
        wait_until(
            lambda: [r for r in ledger_rows(tmp_path) if r.delivery_state == "delivered"],
            timeout=60,
        )
        runs = [r for r in ledger_rows(tmp_path) if "after-restart" in (r.goal or "")]
        assert len(runs) == 1  # the command ran once, after its approval
    finally:
        server.stop()
    store = session_file_store(tmp_path / "sessions.db")
    try:
        assert store.get_approval(pending_id).status == "denied"
    finally:
        store.close()
