"""Verifying an inbound event's Standard Webhooks signature (``POST /v1/hooks/{name}``).

The sender signs ``"{webhook-id}.{webhook-timestamp}.{body}"`` with HMAC-SHA256 under the
key of a ``whsec_`` secret and sends ``webhook-signature: v1,<base64>`` (several,
space-separated, while it rotates). The event is accepted when any of those signatures is
the one any of the hook's valid secrets gives (constant-time compare: ``hmac.compare_digest``)
and its timestamp is within ``TOLERANCE_SECONDS`` of now, either way, so a captured request
cannot be replayed later. The signing half is ``gateway.webhooks.sign``; this is the stdlib
counterpart of the ``standardwebhooks`` package's ``Webhook.verify``, without its
dependencies.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.webhooks import secret_key

__all__ = ["MAX_WEBHOOK_ID", "TOLERANCE_SECONDS", "SignatureError", "SignedHeaders", "verify"]

TOLERANCE_SECONDS = 300
MAX_WEBHOOK_ID = 200
_MAX_SIGNATURES = 16


class SignatureError(Exception):
    """The request is not a verified event. ``status``: 400 (headers missing or malformed),
    401 (a stale timestamp, or no signature that verifies); ``code``: the error code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass(frozen=True, slots=True)
class SignedHeaders:
    webhook_id: str
    timestamp: int
    signatures: tuple[str, ...]


def read_headers(headers: Mapping[str, str]) -> SignedHeaders:
    """The three Standard Webhooks headers, checked for shape (400 when one is missing)."""
    msg_id = headers.get("webhook-id", "")
    stamp = headers.get("webhook-timestamp", "")
    signature = headers.get("webhook-signature", "")
    missing = [
        name
        for name, value in (
            ("webhook-id", msg_id),
            ("webhook-timestamp", stamp),
            ("webhook-signature", signature),
        )
        if not value
    ]
    if missing:
        raise SignatureError(
            400,
            "missing_signature_headers",
            f"missing header(s) {', '.join(missing)}: inbound events are signed with "
            "Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature)",
        )
    if len(msg_id) > MAX_WEBHOOK_ID or not msg_id.isascii() or not msg_id.isprintable():
        raise SignatureError(
            400, "invalid_webhook_id", f"webhook-id must be 1-{MAX_WEBHOOK_ID} printable ASCII"
        )
    if not stamp.isascii() or not stamp.isdigit() or len(stamp) > 12:
        raise SignatureError(
            400, "invalid_timestamp", "webhook-timestamp must be whole seconds since the epoch"
        )
    found = tuple(
        part[3:] for part in signature.split(" ")[:_MAX_SIGNATURES] if part.startswith("v1,")
    )
    return SignedHeaders(msg_id, int(stamp), found)


def verify(
    secrets: Sequence[str],
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    *,
    tolerance_seconds: float = TOLERANCE_SECONDS,
) -> SignedHeaders:
    """The verified headers of a signed request, or SignatureError saying why not."""
    signed = read_headers(headers)
    if abs(now - signed.timestamp) > tolerance_seconds:
        raise SignatureError(
            401,
            "stale_timestamp",
            f"webhook-timestamp is {abs(now - signed.timestamp):.0f} s away from this "
            f"server's clock; at most {tolerance_seconds:g} s is accepted (a replay, or a "
            "clock to fix)",
        )
    message = f"{signed.webhook_id}.{signed.timestamp}.".encode() + body
    expected = [hmac.new(secret_key(s), message, hashlib.sha256).digest() for s in secrets]
    for given in signed.signatures:
        try:
            raw = base64.b64decode(given, validate=True)
        except ValueError:
            continue
        # Every secret is compared, a match or not, so timing tells nothing about which.
        if any([hmac.compare_digest(raw, e) for e in expected]):
            return signed
    raise SignatureError(
        401, "invalid_signature", "no webhook-signature verifies with this hook's secret"
    )
