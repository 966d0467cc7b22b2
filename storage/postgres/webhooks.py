"""The webhook store in the PostgreSQL database (``delivery.webhooks_backend``), shared by
every server on every host: whichever claims a due row sends it.

The tables come from migration 7 (``storage.postgres.migrations``). A claim locks the rows
it picks with ``FOR UPDATE SKIP LOCKED``, so servers claiming at once take different rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.postgres.conn import PLACEHOLDER
from storage.postgres.pooled import PooledStore
from storage.webhooks_sql import SqlWebhooks

if TYPE_CHECKING:
    from delivery.webhooks_backend import WebhookBackend

__all__ = ["PostgresWebhooks"]


class PostgresWebhooks(PooledStore, SqlWebhooks):
    """``WebhookBackend`` on a PostgreSQL database (see the module docstring)."""

    what = "webhook store"

    def __init__(self, url: str) -> None:
        PooledStore.__init__(self, url, name="reveille-webhooks")
        SqlWebhooks.__init__(self, PLACEHOLDER, lock_clause=" FOR UPDATE SKIP LOCKED")


if TYPE_CHECKING:
    _conforms: type[WebhookBackend] = PostgresWebhooks
