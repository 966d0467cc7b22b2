"""The webhook store in ``ledger.db`` (``delivery.webhooks_backend``), beside the ledger.

The tables belong to the ledger's schema (version 2, ``storage.sqlite.webhooks_sql``) and the
file is opened with the ledger's marks, so a version-1 ledger gains them whichever of the two
opens it first. Webhooks are few and each write is small: one connection under a lock, each
write its own ``BEGIN IMMEDIATE`` transaction (so every process sharing the file sees a
claim at once), instead of a second group-commit writer thread.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from storage.sqlite.files import PLACEHOLDER
from storage.sqlite.ledger_side import LedgerSideStore
from storage.webhooks_sql import SqlWebhooks

if TYPE_CHECKING:
    from delivery.webhooks_backend import WebhookBackend

__all__ = ["SqliteWebhooks"]


class SqliteWebhooks(LedgerSideStore, SqlWebhooks):
    """``WebhookBackend`` on the ledger's SQLite file (see the module docstring)."""

    what = "webhook store"

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 5000) -> None:
        # Its tables are part of the ledger's own schema (version 2): no DDL of its own.
        LedgerSideStore.__init__(self, path, busy_timeout_ms=busy_timeout_ms)
        SqlWebhooks.__init__(self, PLACEHOLDER)


if TYPE_CHECKING:
    _conforms: type[WebhookBackend] = SqliteWebhooks
