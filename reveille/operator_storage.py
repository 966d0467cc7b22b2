"""How the CLI's operator tools open the store the server keeps: through the opener, at the
settings' url, never migrating (a database whose schema this build does not know is refused,
not changed under a running server)."""

from __future__ import annotations

import storage
from reveille.app import storage_url
from reveille.settings import Settings
from storage.opener import Storage


def operator_storage(settings: Settings) -> Storage:
    """The server's storage, opened for an operator's tool."""
    return storage.open_storage(storage_url(settings), migrate=False)


def storage_to_look_at(settings: Settings, *, look: bool = True) -> Storage | None:
    """``operator_storage``; with ``look``, None when there is no ledger yet (a look
    creates no store)."""
    location = operator_storage(settings)
    if look and not location.has("ledger"):
        return None
    return location
