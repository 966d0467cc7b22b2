"""Reading an old ``telegram.db`` (the Telegram adapter's own file before its state moved
into the store), so that its inbox, offset, reply records and chat sessions are absorbed on
the first start and nothing owed is lost.

The file is checked to be the old adapter's (application id "RTG1");
its schema version 1 had no ``chat_sessions`` table.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from delivery.telegram_backend import (
    TelegramDump,
    TelegramDumpChat,
    TelegramDumpDone,
    TelegramDumpInbox,
    TelegramDumpPart,
)
from storage.sqlite.telegram import TelegramStateError

__all__ = ["read_legacy_file"]

_APPLICATION_ID = 0x5254_4731  # "RTG1"


def read_legacy_file(path: Path) -> TelegramDump:
    """Everything ``path`` holds; ``TelegramStateError`` when it is not an old state file."""
    try:
        # Not read-only: a file left by a killed server may need its log recovered, and
        # closing the last connection folds the log into the file before it is renamed.
        conn = sqlite3.connect(str(path))
    except sqlite3.Error as exc:
        raise TelegramStateError(f"{path}: cannot be opened: {exc}") from None
    try:
        (app_id,) = conn.execute("PRAGMA application_id").fetchone()
        if int(app_id) != _APPLICATION_ID:
            raise TelegramStateError(f"{path} is not a Reveille Telegram state file")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        dump = TelegramDump()
        for bot, nxt in conn.execute("SELECT bot, next_offset FROM offsets"):
            dump.offsets[str(bot)] = int(nxt)
        for bot, uid, payload, received, answered in conn.execute(
            "SELECT bot, update_id, payload, received_at, answered_at FROM inbox"
        ):
            dump.inbox.append(
                TelegramDumpInbox(
                    str(bot),
                    int(uid),
                    str(payload),
                    float(received),
                    None if answered is None else float(answered),
                )
            )
        for key, part, chat_id, mid in conn.execute(
            "SELECT reply_key, part, chat_id, message_id FROM reply_parts"
        ):
            dump.parts.append(TelegramDumpPart(str(key), int(part), str(chat_id), int(mid)))
        for key, done_at in conn.execute("SELECT reply_key, done_at FROM replies_done"):
            dump.done.append(TelegramDumpDone(str(key), float(done_at)))
        if "chat_sessions" in tables:
            for key, sid, started in conn.execute(
                "SELECT chat_key, session_id, started_at FROM chat_sessions"
            ):
                dump.chats.append(TelegramDumpChat(str(key), str(sid), float(started)))
        return dump
    except sqlite3.Error as exc:
        raise TelegramStateError(f"{path}: cannot be read: {exc}") from None
    finally:
        conn.close()
