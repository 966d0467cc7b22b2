"""The inbound-event store in ``ledger.db`` (``delivery.inbound_backend``), beside the ledger
(``storage.sqlite.ledger_side``): its tables (``storage.hooks_sql.HOOK_DDL``) are additive,
created if missing whenever it opens the file; the file is private (the hooks' secrets are
in it)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from storage.hooks_sql import HOOK_DDL, SqlHooks
from storage.sqlite.ledger_side import LedgerSideStore

if TYPE_CHECKING:
    from delivery.inbound_backend import HookBackend

__all__ = ["SqliteHooks"]


class SqliteHooks(LedgerSideStore, SqlHooks):
    """``HookBackend`` on the ledger's SQLite file."""

    what = "inbound-event store"

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 5000) -> None:
        super().__init__(path, ddl=HOOK_DDL, busy_timeout_ms=busy_timeout_ms)


if TYPE_CHECKING:
    _conforms: type[HookBackend] = SqliteHooks
