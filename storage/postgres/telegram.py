"""The Telegram state in the PostgreSQL database (``delivery.telegram_backend`` over
``storage.telegram_sql``), shared by every server on every host: one of them polls (the
lease), any of them takes a webhook update, and each update is claimed by one.

The tables come from the migration "telegram: the adapter's state in the store"
(``storage.postgres.migrations``); the polling lease is a row of the ledger's ``leases``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.postgres.conn import PLACEHOLDER
from storage.postgres.pooled import PooledStore
from storage.telegram_sql import SqlTelegram

if TYPE_CHECKING:
    from delivery.telegram_backend import TelegramBackend

__all__ = ["PostgresTelegram"]


class PostgresTelegram(PooledStore, SqlTelegram):
    """``TelegramBackend`` on a PostgreSQL database (see the module docstring)."""

    what = "Telegram state"

    def __init__(self, url: str) -> None:
        PooledStore.__init__(self, url, name="reveille-telegram")
        SqlTelegram.__init__(self, PLACEHOLDER)


if TYPE_CHECKING:
    _conforms: type[TelegramBackend] = PostgresTelegram
