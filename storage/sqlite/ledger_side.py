"""A small store of its own tables in ``ledger.db``, beside the ledger: the webhook store,
the inbound-event store.

The file is opened with the ledger's marks (created private: secrets live in it) and the
store's DDL is applied on open (``CREATE ... IF NOT EXISTS``), so whichever of the ledger
and its side stores opens a file first, it gains every table. Their rows are few and each
write small: one connection under a lock, each write its own ``BEGIN IMMEDIATE``
transaction (every process sharing the file sees it at once), no group-commit writer.
"""

from __future__ import annotations

import os

from delivery.errors import LedgerUnavailable
from storage.sqlite import files as sqlite_files
from storage.sqlite.ledger import _FILE_ERRORS, _SCHEMA, APPLICATION_ID, SCHEMA_VERSION
from storage.sqlite.one_connection import OneConnectionStore

__all__ = ["LedgerSideStore"]


class LedgerSideStore(OneConnectionStore):
    """The connection of a side store: ``_tx`` (one write transaction), ``_snapshot`` (a
    plain read, beside the ledger's writer thanks to WAL) and ``close``."""

    what = "side store"  # names the store in errors ("the webhook store is closed")

    def __init__(
        self, path: str | os.PathLike[str], *, ddl: str = "", busy_timeout_ms: int = 5000
    ) -> None:
        file = sqlite_files.SqliteFile(
            str(path),
            name="ledger",
            application_id=APPLICATION_ID,
            schema_version=SCHEMA_VERSION,
            errors=_FILE_ERRORS,
            busy_timeout_ms=busy_timeout_ms,
        )
        super().__init__(file, _SCHEMA + ddl, LedgerUnavailable)
