"""Errors the ledger raises; each says what went wrong and that nothing was written."""

from __future__ import annotations


class LedgerError(Exception):
    """Base class of ledger errors."""


class LedgerUnavailable(LedgerError):
    """The database cannot be written or read now (locked past the timeout, removed, full)."""


class NotALedgerError(LedgerError):
    """The file at the ledger path exists but is not a ledger database; it is left untouched."""


class UnknownDeliveryError(LedgerError, KeyError):
    """No row has that id."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown delivery"


class DuplicateDeliveryError(LedgerError):
    """A row with that id exists already."""


class InvalidTransitionError(LedgerError):
    """The requested state change is not an edge of the lifecycle."""


class ClaimMismatchError(LedgerError):
    """The claim token is not the one the row's current holder was given."""
