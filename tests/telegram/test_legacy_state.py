"""`reveille serve` on a state directory an older Reveille left a ``telegram.db`` in: the first
start moves it into the store (``chats.db``) and renames it ``telegram.db.migrated``; the
update it had taken but not answered is answered, and the chat's session chosen by ``/new``
is kept. ``chats.db`` is backed up and restored with the other stores."""

from __future__ import annotations

import time
from pathlib import Path

from tests.api_server.serve_support import call, wait_until
from tests.telegram.conftest import serve
from tests.telegram.fake_bot_api import TOKEN, FakeBotApi
from tests.telegram.legacy_file import make_legacy_file

BOT = TOKEN.split(":")[0]
FRESH = "agent:main:telegram:dm:42:new-0123456789ab"


def test_the_first_start_moves_the_old_file_into_the_store(tmp_path: Path, bot: FakeBotApi):
    payload = (
        '{"update_id": 900, "message": {"message_id": 900, "date": 1, "text": "left behind",'
        ' "chat": {"id": 42, "type": "private"}, "from": {"id": 42, "is_bot": false,'
        ' "first_name": "u"}}}'
    )
    make_legacy_file(
        tmp_path / "telegram.db",
        f"""
        INSERT INTO offsets VALUES ('{BOT}', 901);
        INSERT INTO inbox VALUES ('{BOT}', 900, '{payload}', 1.0, NULL);
        INSERT INTO chat_sessions VALUES ('agent:main:telegram:dm:42', '{FRESH}', 4.0);
        """,
    )
    server = serve(tmp_path, bot)
    try:
        wait_until(lambda: bot.texts_to(42))
        assert "left behind" in bot.texts_to(42)[0]
        assert not (tmp_path / "telegram.db").exists()
        assert (tmp_path / "telegram.db.migrated").is_file()
        assert (tmp_path / "chats.db").is_file()
        # The offset came over: the first poll confirms what the old file had taken.
        wait_until(lambda: bot.calls_of("getUpdates"))
        assert bot.calls_of("getUpdates")[0]["offset"] == 901
        status, _, data = call(server.port, "GET", f"/api/sessions/{FRESH}/messages")
        assert status == 200, data
        assert [m["content"] for m in data["data"] if m["role"] == "user"] == ["left behind"]
    finally:
        server.stop()
    again = serve(tmp_path, bot)  # nothing to move any more, nothing answered twice
    try:
        time.sleep(1.0)
        assert len(bot.texts_to(42)) == 1
        assert not (tmp_path / "telegram.db").exists()
    finally:
        again.stop()


def test_backup_and_restore_carry_the_chats_state(tmp_path: Path) -> None:
    """``chats.db`` is one of the state directory's stores: backed up with the others and
    opened by the restore's check."""
    from reveille.backup import backup, restore
    from tests.stores import telegram_backend

    home = tmp_path / "home"
    state = telegram_backend("sqlite", home)
    state.start_chat_session("agent:main:telegram:dm:42", "kept", now=1.0)
    state.close()
    assert "chats.db" in backup(home, tmp_path / "b")
    assert "chats.db" in restore(tmp_path / "b", tmp_path / "restored")
    again = telegram_backend("sqlite", tmp_path / "restored")
    try:
        assert again.chat_session("agent:main:telegram:dm:42") == "kept"
    finally:
        again.close()
