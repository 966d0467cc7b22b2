"""The web UI's face of approvals: ``gateway.approvals`` holds the store-backed logic that
every surface shares (web UI, API server, Telegram, the operator's CLI); the web UI's turns,
server and tests import it from here, as they did before it moved down."""

from __future__ import annotations

from gateway.approvals import AlreadyDecided, ApprovalListener, ApprovalRecord, Approvals, Expired

__all__ = ["AlreadyDecided", "ApprovalListener", "ApprovalRecord", "Approvals", "Expired"]
