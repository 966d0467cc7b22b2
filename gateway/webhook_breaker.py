"""One webhook endpoint's circuit breaker: how many sends it may have in flight right now.

Closed, an endpoint gets the policy's in-flight limit. After ``failures`` consecutive failed
sends (no answer, or an answer that is neither 2xx nor 410) it opens: nothing is claimed for
it for ``open_seconds``, so its rows stay owed (no attempt is spent on a receiver known to be
down) and its retries cost nobody else a thing. Then it is half-open: one probe send; a
success closes it, a failure opens it again for twice as long (up to ``max_open_seconds``).
A ``Retry-After`` (429, 503) holds the endpoint until then, whatever the state.

The breaker is this process's view of the endpoint, not an obligation: the rows it holds
back live in the store and any server may send them. Pure logic on a caller's clock; the
sender logs the transitions it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RECOVERED", "TRIPPED", "Breaker"]

TRIPPED = "tripped"
RECOVERED = "recovered"


@dataclass(slots=True)
class Breaker:
    failures: int = 5
    open_seconds: float = 30.0
    max_open_seconds: float = 600.0
    # consecutive failed sends; while open, ``reopen_at`` says when a probe may go
    failed_in_a_row: int = 0
    is_open: bool = False
    reopen_at: float = 0.0
    _open_for: float = 0.0
    _probing: bool = False
    # a Retry-After hold, apart from the breaker's own state
    hold_until: float = 0.0

    def allowance(self, now: float, limit: int) -> int:
        """How many sends the endpoint may have in flight at ``now`` (0: none may start)."""
        if now < self.hold_until:
            return 0
        if not self.is_open:
            return limit
        if now < self.reopen_at or self._probing:
            return 1 if self._probing else 0
        self._probing = True  # half-open: one probe, whose outcome decides
        return 1

    def next_change_at(self) -> float:
        """When ``allowance`` may grow without an answer arriving (0: nothing pending)."""
        return max(self.hold_until, self.reopen_at if self.is_open and not self._probing else 0)

    def record(self, ok: bool, now: float, retry_after: float | None = None) -> str | None:
        """Count one send's outcome; returns TRIPPED or RECOVERED on those transitions only
        (a probe failing again is not news)."""
        if retry_after is not None and retry_after > 0:
            self.hold_until = max(self.hold_until, now + retry_after)
        if ok:
            self.failed_in_a_row = 0
            was_open, self.is_open, self._probing, self._open_for = self.is_open, False, False, 0
            return RECOVERED if was_open else None
        self.failed_in_a_row += 1
        if self.is_open:
            if self._probing:  # the probe failed: wait longer before the next one
                self._probing = False
                self._open_for = min(self._open_for * 2, self.max_open_seconds)
                self.reopen_at = max(now + self._open_for, self.hold_until)
            return None
        if self.failed_in_a_row < self.failures:
            return None
        self.is_open = True
        self._open_for = self.open_seconds
        self.reopen_at = max(now + self._open_for, self.hold_until)
        return TRIPPED
