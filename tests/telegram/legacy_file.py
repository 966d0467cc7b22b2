"""An old ``telegram.db`` as the adapter made it before its state moved into the store
(schema 2: offsets, inbox, reply_parts, chat_sessions, replies_done; application id "RTG1")."""

from __future__ import annotations

import sqlite3
from pathlib import Path

_SCHEMA = """
PRAGMA application_id = 1381254961;
PRAGMA user_version = 2;
PRAGMA journal_mode = WAL;
CREATE TABLE offsets (bot TEXT PRIMARY KEY, next_offset INTEGER NOT NULL);
CREATE TABLE inbox (bot TEXT NOT NULL, update_id INTEGER NOT NULL, payload TEXT NOT NULL,
    received_at REAL NOT NULL, answered_at REAL, PRIMARY KEY (bot, update_id));
CREATE TABLE reply_parts (reply_key TEXT NOT NULL, part INTEGER NOT NULL,
    chat_id TEXT NOT NULL, message_id INTEGER NOT NULL, PRIMARY KEY (reply_key, part));
CREATE TABLE chat_sessions (chat_key TEXT PRIMARY KEY, session_id TEXT NOT NULL,
    started_at REAL NOT NULL);
CREATE TABLE replies_done (reply_key TEXT PRIMARY KEY, done_at REAL NOT NULL);
"""


def make_legacy_file(path: Path, rows: str) -> None:
    """The old file at ``path`` holding ``rows`` (INSERT statements)."""
    conn = sqlite3.connect(path)
    try:
        conn.executescript(_SCHEMA + rows)
        conn.commit()
    finally:
        conn.close()
