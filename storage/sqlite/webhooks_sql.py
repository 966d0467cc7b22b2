"""The webhook tables of ``ledger.db`` (ledger schema version 2), kept apart from the ledger's
own DDL so the step from version 1 is one self-contained script: ``CREATE ... IF NOT
EXISTS`` only, so a version-1 file gains the tables when a version-2 build opens it."""

from __future__ import annotations

__all__ = ["WEBHOOK_DDL"]

WEBHOOK_DDL = """
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    id TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    event_type TEXT NOT NULL,
    object_id TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at REAL NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL DEFAULT 0,
    claim_token TEXT,
    claim_expires_at REAL NOT NULL DEFAULT 0,
    settled_at REAL,
    settled_reason TEXT,
    PRIMARY KEY (id, endpoint)
);
CREATE INDEX IF NOT EXISTS ix_webhook_pending ON webhook_deliveries(next_attempt_at)
    WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS ix_webhook_created ON webhook_deliveries(created_at);
CREATE TABLE IF NOT EXISTS webhook_attempts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    at REAL NOT NULL,
    consumer TEXT NOT NULL,
    outcome TEXT NOT NULL,
    status INTEGER,
    error TEXT
);
CREATE INDEX IF NOT EXISTS ix_webhook_attempts ON webhook_attempts(delivery_id, seq);
CREATE TABLE IF NOT EXISTS webhook_secrets (
    secret TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    expires_at REAL
);
"""
