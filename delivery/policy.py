"""The numbers that bound delivery: lease, attempt budget, replay age cap, retry backoff."""

from __future__ import annotations

from dataclasses import dataclass

LEASE_SECONDS = 300.0
MAX_ATTEMPTS = 8
REPLAY_CAP_SECONDS = 48 * 3600.0
PEER_TIMEOUT_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class DeliveryPolicy:
    lease_seconds: float = LEASE_SECONDS
    max_attempts: int = MAX_ATTEMPTS
    replay_cap_seconds: float = REPLAY_CAP_SECONDS
    retry_base_seconds: float = 2.0
    retry_max_seconds: float = 300.0
    # A server on another host whose heartbeat is older than this is dead.
    peer_timeout_seconds: float = PEER_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        if self.lease_seconds <= 0:
            raise ValueError("lease_seconds must be positive")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.replay_cap_seconds <= 0:
            raise ValueError("replay_cap_seconds must be positive")
        if self.peer_timeout_seconds <= 0:
            raise ValueError("peer_timeout_seconds must be positive")
        if not 0 <= self.retry_base_seconds <= self.retry_max_seconds:
            raise ValueError("need 0 <= retry_base_seconds <= retry_max_seconds")

    def retry_delay(self, releases: int) -> float:
        """Wait before the next claim after the ``releases``-th release (1-based); grows."""
        exponent = max(releases - 1, 0)
        return min(self.retry_base_seconds * (2 ** min(exponent, 32)), self.retry_max_seconds)
