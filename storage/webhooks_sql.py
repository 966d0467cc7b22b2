"""The webhook store's SQL, written once for both SQL dialects (``delivery.webhooks_backend``).

SQLite's and psycopg's connections both run ``conn.execute(sql, params)`` and return a
cursor, so one class holds every statement, parameterized by the placeholder mark (``?`` or
``%s``). A dialect supplies ``_tx()``: a context manager giving a connection inside one write
transaction (SQLite: ``BEGIN IMMEDIATE``, the file's only writer until commit; PostgreSQL:
a transaction whose claim query locks the rows it picks with ``FOR UPDATE SKIP LOCKED``, so
two servers claiming at once pick different rows instead of waiting on each other).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from delivery.webhooks_backend import (
    DELIVERED,
    DROPPED,
    PENDING,
    EndpointStats,
    Settlement,
    WebhookAttempt,
    WebhookDelivery,
    WebhookSecret,
)
from storage.sql_tables import SqlTables

__all__ = ["SqlWebhooks"]

_COLUMNS = (
    "id, endpoint, event_type, object_id, body, created_at, state, attempts, next_attempt_at, "
    "claim_token, claim_expires_at, settled_at, settled_reason"
)


def _delivery(row: Sequence[Any]) -> WebhookDelivery:
    return WebhookDelivery(
        id=str(row[0]),
        endpoint=str(row[1]),
        event_type=str(row[2]),
        object_id=str(row[3]),
        body=str(row[4]),
        created_at=float(row[5]),
        state=str(row[6]),
        attempts=int(row[7]),
        next_attempt_at=float(row[8]),
        claim_token=row[9],
        claim_expires_at=float(row[10]),
        settled_at=None if row[11] is None else float(row[11]),
        settled_reason=row[12],
    )


class SqlWebhooks(SqlTables):
    """``WebhookBackend`` over a SQL connection; subclasses give ``_tx`` and ``close``."""

    def __init__(self, mark: str, *, lock_clause: str = "") -> None:
        """``mark``: the dialect's placeholder (``storage.sql.marked``); ``lock_clause``:
        what locks a claimed row (PostgreSQL: FOR UPDATE SKIP LOCKED)."""
        self.mark = mark
        self.lock_clause = lock_clause

    def add(self, rows: Sequence[WebhookDelivery]) -> int:
        added = 0
        with self._tx() as conn:
            for r in rows:
                cur = conn.execute(
                    self._sql(
                        "INSERT INTO webhook_deliveries (id, endpoint, event_type, object_id, "
                        "body, created_at, state, attempts, next_attempt_at) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?) ON CONFLICT DO NOTHING"
                    ),
                    (
                        r.id,
                        r.endpoint,
                        r.event_type,
                        r.object_id,
                        r.body,
                        r.created_at,
                        r.state,
                        r.next_attempt_at,
                    ),
                )
                added += max(cur.rowcount, 0)
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
        only, params = ("", []) if endpoint is None else (" AND endpoint = ?", [endpoint])
        with self._tx() as conn:
            picked = conn.execute(
                self._sql(
                    f"SELECT {_COLUMNS} FROM webhook_deliveries WHERE state = 'pending' "
                    f"AND next_attempt_at <= ? AND claim_expires_at <= ?{only} "
                    f"ORDER BY created_at, id, endpoint LIMIT ?{self.lock_clause}"
                ),
                (now, now, *params, int(limit)),
            ).fetchall()
            claimed = []
            for row in picked:
                delivery = _delivery(row)
                # compare-and-set: only a row still free is taken (and nothing else can
                # change it before the commit: SQLite holds the write lock, PostgreSQL the
                # row lock), so the row read above, with the claim, is what is stored
                cur = conn.execute(
                    self._sql(
                        "UPDATE webhook_deliveries SET claim_token = ?, claim_expires_at = ? "
                        "WHERE id = ? AND endpoint = ? AND state = 'pending' "
                        "AND claim_expires_at <= ?"
                    ),
                    (token, now + lease_seconds, delivery.id, delivery.endpoint, now),
                )
                if cur.rowcount == 1:
                    claimed.append(delivery.with_claim(token, now + lease_seconds))
        return claimed

    def settle(self, attempt: WebhookAttempt, token: str, settlement: Settlement) -> bool:
        with self._tx() as conn:
            conn.execute(
                self._sql(
                    "INSERT INTO webhook_attempts (delivery_id, endpoint, at, consumer, outcome, "
                    "status, error) VALUES (?, ?, ?, ?, ?, ?, ?)"
                ),
                (
                    attempt.delivery_id,
                    attempt.endpoint,
                    attempt.at,
                    attempt.consumer,
                    attempt.outcome,
                    attempt.status,
                    attempt.error,
                ),
            )
            settled_at = None if settlement.state == PENDING else attempt.at
            cur = conn.execute(
                self._sql(
                    "UPDATE webhook_deliveries SET state = ?, attempts = attempts + 1, "
                    "next_attempt_at = ?, claim_token = NULL, claim_expires_at = 0, "
                    "settled_at = ?, settled_reason = ? "
                    "WHERE id = ? AND endpoint = ? AND state = 'pending' AND claim_token = ?"
                ),
                (
                    settlement.state,
                    settlement.next_attempt_at,
                    settled_at,
                    settlement.reason,
                    attempt.delivery_id,
                    attempt.endpoint,
                    token,
                ),
            )
            return bool(cur.rowcount == 1)

    def deliveries(self, delivery_id: str) -> list[WebhookDelivery]:
        rows = self._read(
            f"SELECT {_COLUMNS} FROM webhook_deliveries WHERE id = ? ORDER BY endpoint",
            (delivery_id,),
        )
        return [_delivery(r) for r in rows]

    def attempts(self, delivery_id: str) -> list[WebhookAttempt]:
        rows = self._read(
            "SELECT delivery_id, endpoint, at, consumer, outcome, status, error "
            "FROM webhook_attempts WHERE delivery_id = ? ORDER BY seq",
            (delivery_id,),
        )
        return [
            WebhookAttempt(
                delivery_id=str(r[0]),
                endpoint=str(r[1]),
                at=float(r[2]),
                consumer=str(r[3]),
                outcome=str(r[4]),
                status=None if r[5] is None else int(r[5]),
                error=r[6],
            )
            for r in rows
        ]

    def recent(self, limit: int, state: str | None = None) -> list[WebhookDelivery]:
        where, params = ("", []) if state is None else (" WHERE state = ?", [state])
        rows = self._read(
            f"SELECT {_COLUMNS} FROM webhook_deliveries{where} "
            "ORDER BY created_at DESC, id DESC, endpoint LIMIT ?",
            [*params, int(limit)],
        )
        return [_delivery(r) for r in rows]

    def next_due_at(self, endpoint: str | None = None) -> float | None:
        only, params = ("", []) if endpoint is None else (" AND endpoint = ?", [endpoint])
        rows = self._read(
            "SELECT min(CASE WHEN claim_expires_at > next_attempt_at THEN claim_expires_at "
            f"ELSE next_attempt_at END) FROM webhook_deliveries WHERE state = 'pending'{only}",
            params,
        )
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def endpoint_stats(self) -> list[EndpointStats]:
        rows = self._read(
            "SELECT endpoint, state, count(*), min(created_at) FROM webhook_deliveries "
            "GROUP BY endpoint, state ORDER BY endpoint"
        )
        found: dict[str, EndpointStats] = {}
        for endpoint, state, count, oldest in rows:
            s = found.setdefault(str(endpoint), EndpointStats(str(endpoint)))
            if state == PENDING:
                s = replace(s, owed=int(count), oldest_owed_at=float(oldest))
            elif state == DELIVERED:
                s = replace(s, delivered=int(count))
            elif state == DROPPED:
                s = replace(s, failed=int(count))
            found[str(endpoint)] = s
        return list(found.values())

    def secrets(self, now: float) -> list[WebhookSecret]:
        rows = self._read(
            "SELECT secret, created_at, expires_at FROM webhook_secrets "
            "WHERE expires_at IS NULL OR expires_at > ? ORDER BY created_at DESC",
            (now,),
        )
        return [
            WebhookSecret(str(r[0]), float(r[1]), None if r[2] is None else float(r[2]))
            for r in rows
        ]

    def rotate_secret(self, secret: str, now: float, overlap_seconds: float) -> None:
        with self._tx() as conn:
            conn.execute(
                self._sql(
                    "UPDATE webhook_secrets SET expires_at = ? "
                    "WHERE expires_at IS NULL OR expires_at > ?"
                ),
                (now + overlap_seconds, now + overlap_seconds),
            )
            conn.execute(
                self._sql("INSERT INTO webhook_secrets (secret, created_at) VALUES (?, ?)"),
                (secret, now),
            )
