"""The webhook store in this process's memory (``delivery.webhooks_backend``): for tests and
embedding, where no other server shares it. Every operation runs under one lock, which makes
each claim and settlement as atomic as a SQL transaction."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from delivery.webhooks_backend import (
    DELIVERED,
    DROPPED,
    PENDING,
    EndpointStats,
    Settlement,
    WebhookAttempt,
    WebhookDelivery,
    WebhookSecret,
    may_claim,
    sort_due,
)

if TYPE_CHECKING:
    from delivery.webhooks_backend import WebhookBackend

__all__ = ["MemoryWebhooks"]


class MemoryWebhooks:
    """``WebhookBackend`` in memory (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str], WebhookDelivery] = {}
        self._attempts: list[WebhookAttempt] = []
        self._secrets: list[WebhookSecret] = []

    def add(self, rows: Sequence[WebhookDelivery]) -> int:
        added = 0
        with self._lock:
            for row in rows:
                key = (row.id, row.endpoint)
                if key not in self._rows:
                    self._rows[key] = dataclasses.replace(row, attempts=0)
                    added += 1
        return added

    def claim_due(
        self,
        now: float,
        consumer: str,
        token: str,
        lease_seconds: float,
        limit: int,
        *,
        endpoint: str | None = None,
    ) -> list[WebhookDelivery]:
        with self._lock:
            due = [r for r in self._rows.values() if may_claim(r, now, endpoint)]
            due = sort_due(due)[:limit]
            claimed = [r.with_claim(token, now + lease_seconds) for r in due]
            for row in claimed:
                self._rows[(row.id, row.endpoint)] = row
            return claimed

    def settle(self, attempt: WebhookAttempt, token: str, settlement: Settlement) -> bool:
        with self._lock:
            self._attempts.append(attempt)
            key = (attempt.delivery_id, attempt.endpoint)
            row = self._rows.get(key)
            if row is None or row.state != PENDING or row.claim_token != token:
                return False
            self._rows[key] = dataclasses.replace(
                row,
                state=settlement.state,
                attempts=row.attempts + 1,
                next_attempt_at=settlement.next_attempt_at,
                claim_token=None,
                claim_expires_at=0.0,
                settled_at=None if settlement.state == PENDING else attempt.at,
                settled_reason=settlement.reason,
            )
            return True

    def deliveries(self, delivery_id: str) -> list[WebhookDelivery]:
        with self._lock:
            found = [r for (i, _), r in self._rows.items() if i == delivery_id]
        return sorted(found, key=lambda r: r.endpoint)

    def attempts(self, delivery_id: str) -> list[WebhookAttempt]:
        with self._lock:
            return [a for a in self._attempts if a.delivery_id == delivery_id]

    def recent(self, limit: int, state: str | None = None) -> list[WebhookDelivery]:
        with self._lock:
            rows = [r for r in self._rows.values() if state is None or r.state == state]
        rows.sort(key=lambda r: r.endpoint)
        rows.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        return rows[:limit]

    def next_due_at(self, endpoint: str | None = None) -> float | None:
        with self._lock:
            due = [
                max(r.next_attempt_at, r.claim_expires_at)
                for r in self._rows.values()
                if r.state == PENDING and (endpoint is None or r.endpoint == endpoint)
            ]
        return min(due) if due else None

    def endpoint_stats(self) -> list[EndpointStats]:
        with self._lock:
            rows = list(self._rows.values())
        found: dict[str, EndpointStats] = {}
        for r in rows:
            s = found.get(r.endpoint) or EndpointStats(r.endpoint)
            if r.state == PENDING:
                oldest = s.oldest_owed_at
                s = dataclasses.replace(
                    s,
                    owed=s.owed + 1,
                    oldest_owed_at=r.created_at if oldest is None else min(oldest, r.created_at),
                )
            elif r.state == DELIVERED:
                s = dataclasses.replace(s, delivered=s.delivered + 1)
            elif r.state == DROPPED:
                s = dataclasses.replace(s, failed=s.failed + 1)
            found[r.endpoint] = s
        return [found[e] for e in sorted(found)]

    def secrets(self, now: float) -> list[WebhookSecret]:
        with self._lock:
            valid = [s for s in self._secrets if s.expires_at is None or s.expires_at > now]
        return sorted(valid, key=lambda s: s.created_at, reverse=True)

    def rotate_secret(self, secret: str, now: float, overlap_seconds: float) -> None:
        until = now + overlap_seconds
        with self._lock:
            self._secrets = [
                s
                if s.expires_at is not None and s.expires_at <= until
                else dataclasses.replace(s, expires_at=until)
                for s in self._secrets
            ]
            self._secrets.append(WebhookSecret(secret, now))

    def close(self) -> None:
        pass


if TYPE_CHECKING:
    _conforms: type[WebhookBackend] = MemoryWebhooks
