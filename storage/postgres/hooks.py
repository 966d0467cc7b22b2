"""The inbound-event store in the PostgreSQL database (``delivery.inbound_backend``), shared
by every server on every host: an event posted to any of them is stored once, under the
``(hook, webhook_id)`` key. The tables come from the migration "inbound events"
(``storage.postgres.migrations``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.hooks_sql import SqlHooks
from storage.postgres.conn import PLACEHOLDER
from storage.postgres.pooled import PooledStore

if TYPE_CHECKING:
    from delivery.inbound_backend import HookBackend

__all__ = ["PostgresHooks"]


class PostgresHooks(PooledStore, SqlHooks):
    """``HookBackend`` on a PostgreSQL database (see the module docstring)."""

    mark = PLACEHOLDER
    what = "inbound-event store"

    def __init__(self, url: str) -> None:
        super().__init__(url, name="reveille-hooks")


if TYPE_CHECKING:
    _conforms: type[HookBackend] = PostgresHooks
