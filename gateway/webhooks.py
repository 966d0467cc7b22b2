"""Signed webhooks (Standard Webhooks), sent at least once from the store.

``WebhookSender.enqueue(event_type, object_id)`` writes the event, one row per configured
endpoint, to the store (``delivery.webhooks_backend``) BEFORE anything is sent and returns its
delivery id; the sender then claims due rows (a lease, so whichever server claims a row
sends it and a dead server's claim runs out) and POSTs each with aiohttp. Each endpoint is a
lane of its own (its own claims, at most ``in_flight_per_endpoint`` sends, its own circuit
breaker, ``gateway.webhook_breaker``), so no receiver can hold back another's webhooks; a
connect timeout and a response timeout bound each send, and of an answer only the status
and the first ``answer_cap_bytes`` are read (the rest never is: the connection is closed),
so no receiver can swell the server. Only a 2xx answer delivers; 410 Gone drops that
endpoint's row; anything else (another status, a refused connection, a timeout) is retried
with exponential backoff until the retry window (72 h) ends; a 429/503 ``Retry-After`` holds
the row and the endpoint until then. Every attempt is recorded. Pending rows outlive the
process: the next start (or any other server on the store) resumes them.

The delivery id is derived from (event type, object id), so enqueueing the same event twice
(a re-run after a crash, a redelivered delegation result) owes it once, and a receiver that
dedupes on ``webhook-id`` sees it exactly once; a crash between a send and its record can
cause one extra raw delivery with the same ``webhook-id``.

Payload: ``{"object": "event", "id", "type", "created_at", "data": {"id"}}``. Headers:
``webhook-id``, ``webhook-timestamp`` (this attempt's), ``webhook-signature``: ``v1,<base64
HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`` for each valid secret, space-separated (the key
is the base64 after ``whsec_``), so receivers still holding a rotated-out secret verify during
the overlap. This is what ``openai.OpenAI().webhooks.unwrap`` checks.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import email.utils
import functools
import hashlib
import hmac
import json
import logging
import secrets
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from delivery.webhooks_backend import (
    DELIVERED,
    DROPPED,
    PENDING,
    Settlement,
    WebhookAttempt,
    WebhookBackend,
    WebhookDelivery,
)
from gateway.webhook_breaker import RECOVERED, TRIPPED, Breaker

__all__ = [
    "APPROVAL_REQUESTED",
    "DELEGATION_COMPLETED",
    "ROTATION_OVERLAP_SECONDS",
    "WebhookPolicy",
    "WebhookSender",
    "check_secret",
    "delivery_id_for",
    "new_secret",
    "public_endpoint",
    "sign",
    "signature_header",
]

log = logging.getLogger(__name__)

DELEGATION_COMPLETED = "reveille.delegation.completed"
# A background unit waits for a person; ``data.id`` is the approval (GET /api/approvals).
APPROVAL_REQUESTED = "reveille.approval.requested"
# A rotated-out secret keeps signing this long, so receivers can switch without a gap.
ROTATION_OVERLAP_SECONDS = 24 * 3600.0
_SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A fresh ``whsec_`` secret: 32 random bytes, base64."""
    return _SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret; ValueError naming the problem otherwise."""
    if not secret.startswith(_SECRET_PREFIX):
        raise ValueError(
            "a webhook secret starts with whsec_ (create one: reveille webhooks secret)"
        )
    try:
        key = base64.b64decode(secret[len(_SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the part after whsec_ is not valid base64") from None
    if not 24 <= len(key) <= 64:
        raise ValueError("a webhook secret holds 24 to 64 bytes (base64 after whsec_)")
    return key


def check_secret(secret: str) -> str:
    """``secret`` when it is a usable ``whsec_`` secret (ValueError otherwise)."""
    secret_key(secret)
    return secret


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """One Standard Webhooks signature: ``v1,<base64 HMAC-SHA256>``."""
    mac = hmac.new(secret_key(secret), f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def signature_header(secrets_: Sequence[str], msg_id: str, timestamp: int, body: str) -> str:
    return " ".join(sign(s, msg_id, timestamp, body) for s in secrets_)


def delivery_id_for(event_type: str, object_id: str) -> str:
    """The one delivery id of an event: the same (type, object) always gets the same id."""
    digest = hashlib.sha256(f"{event_type}\0{object_id}".encode()).hexdigest()
    return f"evt_{digest[:32]}"


def event_body(delivery_id: str, event_type: str, object_id: str, created_at: int) -> str:
    return json.dumps(
        {
            "object": "event",
            "id": delivery_id,
            "type": event_type,
            "created_at": created_at,
            "data": {"id": object_id},
        },
        separators=(",", ":"),
    )


@dataclass(frozen=True, slots=True)
class WebhookPolicy:
    """How the sender sends and retries. Delays double from ``first_retry_seconds`` up to
    ``max_retry_seconds``; a row still pending ``max_age_seconds`` after its event is dropped.
    ``connect_timeout_seconds`` bounds the TCP (and TLS) connect, ``timeout_seconds`` the
    whole request with its answer. ``lease_seconds`` must outlast ``timeout_seconds``: a
    claim runs out only when its holder is gone, not while its request is still in flight.
    Each endpoint has at most ``in_flight_per_endpoint`` sends at once and a breaker
    (``gateway.webhook_breaker``: opens after ``breaker_failures`` failures in a row for
    ``breaker_open_seconds``, doubling up to ``breaker_max_open_seconds``). An answer's body
    is read up to ``answer_cap_bytes``; the rest is never read (the connection is closed)."""

    first_retry_seconds: float = 5.0
    max_retry_seconds: float = 3600.0
    max_age_seconds: float = 72 * 3600.0
    timeout_seconds: float = 15.0
    connect_timeout_seconds: float = 5.0
    lease_seconds: float = 60.0
    in_flight_per_endpoint: int = 4
    breaker_failures: int = 5
    breaker_open_seconds: float = 30.0
    breaker_max_open_seconds: float = 600.0
    answer_cap_bytes: int = 4096
    # How often to look for rows other servers enqueued or left behind, when nothing is due
    # sooner (this server's own enqueues wake it at once).
    poll_seconds: float = 15.0

    def __post_init__(self) -> None:
        if self.in_flight_per_endpoint < 1 or self.breaker_failures < 1:
            raise ValueError("in_flight_per_endpoint and breaker_failures must be at least 1")
        if min(self.timeout_seconds, self.connect_timeout_seconds, self.lease_seconds) <= 0:
            raise ValueError("the webhook timeouts and lease must be positive")
        if self.answer_cap_bytes < 0:
            raise ValueError("answer_cap_bytes must not be negative")

    def retry_delay(self, attempts: int) -> float:
        """The wait after the ``attempts``-th failed attempt (1, 2, ...)."""
        return min(self.first_retry_seconds * 2 ** max(attempts - 1, 0), self.max_retry_seconds)


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int | None
    error: str | None
    retry_after: float | None = None  # seconds, from a 429/503's Retry-After


@dataclass(eq=False, slots=True)
class _Lane:
    """One endpoint's sending: its breaker, its sends in flight, the event that wakes it."""

    endpoint: str
    breaker: Breaker
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    sending: set[asyncio.Task[None]] = field(default_factory=set)
    task: asyncio.Task[None] | None = None


class WebhookSender:
    """Owes each event to every endpoint and sends what is due (see the module docstring).

    ``secret`` is the configured one (``[webhooks] secret``); without it the secrets in the
    store (``reveille webhooks secret``) sign. ``consumer`` names this server in claims and
    attempts. Use ``enqueue`` from a thread, ``aenqueue`` from the event loop.

    Each endpoint is a lane of its own: it claims only its own rows, up to its in-flight
    limit, when its breaker lets it, and is woken by its own sends finishing. A receiver that
    hangs fills its own lane and nobody else's, so its retries never delay another
    endpoint's first tries.
    """

    def __init__(
        self,
        backend: WebhookBackend,
        urls: Sequence[str],
        *,
        secret: str = "",
        consumer: str = "",
        policy: WebhookPolicy | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.urls = tuple(urls)
        self.secret = check_secret(secret) if secret else ""
        self.consumer = consumer or f"webhooks-{secrets.token_hex(4)}"
        self.policy = policy or WebhookPolicy()
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._lanes: dict[str, _Lane] = {}
        self._stopping = False
        # when signing became impossible (no secret anywhere); None while one exists
        self._unsigned_since: float | None = None
        self._http: aiohttp.ClientSession | None = None

    # -- what owes an event ---------------------------------------------------------------

    def enqueue(self, event_type: str, object_id: str) -> str:
        """Write the event's obligations (one per endpoint) and return its delivery id.
        Blocking (a store write): call from a thread, or ``aenqueue`` on the loop. An event
        already owed is not owed twice. Raises when the store cannot take it."""
        if not event_type or not object_id:
            raise ValueError("a webhook event needs a type and an object id")
        delivery_id = delivery_id_for(event_type, object_id)
        if not self.urls:
            return delivery_id
        now = self._clock()
        body = event_body(delivery_id, event_type, object_id, int(now))
        rows = [
            WebhookDelivery(delivery_id, url, event_type, object_id, body, now, next_attempt_at=now)
            for url in self.urls
        ]
        if self.backend.add(rows):
            self._poke()
        return delivery_id

    def on_terminal(self, response_id: str, event_type: str) -> str:
        """The Responses API's hook at each terminal state (note its argument order)."""
        return self.enqueue(event_type, response_id)

    async def aenqueue(self, event_type: str, object_id: str) -> str:
        return await asyncio.to_thread(self.enqueue, event_type, object_id)

    async def aon_terminal(self, response_id: str, event_type: str) -> str:
        """``on_terminal`` for coroutines: the store write runs off the event loop."""
        return await self.aenqueue(event_type, response_id)

    def _poke(self) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        """Wake every lane (an enqueue owes something to each configured endpoint); the
        loop that looks for other endpoints keeps its own pace."""
        for lane in self._lanes.values():
            lane.wake.set()

    # -- the loop that sends --------------------------------------------------------------

    async def start(self) -> None:
        self._stopping = False
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(
                total=self.policy.timeout_seconds,
                sock_connect=self.policy.connect_timeout_seconds,
            ),
            # The answer's body is not wanted: never inflate one (a small gzip bomb would
            # otherwise swell to any size) and ask for none.
            auto_decompress=False,
        )
        for url in self.urls:
            self._lane(url)
        self._task = asyncio.create_task(self._run(), name="webhook-sender")

    async def stop(self) -> None:
        """Let the sends in flight finish and record their answers (bounded by the request
        timeout), then stop; whatever is still pending is sent after the next start."""
        task, self._task = self._task, None
        self._stopping = True
        self._wake_all()
        if self._wake is not None:
            self._wake.set()
        tasks = {t for t in (task,) if t is not None}
        for lane in self._lanes.values():
            tasks |= lane.sending | ({lane.task} if lane.task is not None else set())
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.policy.timeout_seconds + 5)
            for t in late:
                t.cancel()
            if late:
                await asyncio.wait(late)
        self._lanes.clear()
        if self._http is not None:
            await self._http.close()
            self._http = None
        self._loop = self._wake = None

    def _lane(self, endpoint: str) -> _Lane:
        lane = self._lanes.get(endpoint)
        if lane is None:
            p = self.policy
            breaker = Breaker(
                p.breaker_failures, p.breaker_open_seconds, p.breaker_max_open_seconds
            )
            lane = self._lanes[endpoint] = _Lane(endpoint, breaker)
            lane.task = asyncio.create_task(self._run_lane(lane), name="webhook-lane")
        return lane

    async def _run(self) -> None:
        """Finds the endpoints owed rows that no configured URL names (one removed from the
        settings, say): each gets a lane too, so what is owed to it is still sent."""
        assert self._wake is not None
        while not self._stopping:
            self._wake.clear()
            try:
                stats = await asyncio.to_thread(self.backend.endpoint_stats)
                for s in stats:
                    if s.owed and not self._stopping:
                        self._lane(s.endpoint)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("webhook sender: looking for owed endpoints failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.policy.poll_seconds)

    async def _run_lane(self, lane: _Lane) -> None:
        while not self._stopping:
            lane.wake.clear()
            try:
                wait = await self._fill(lane)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "webhook sender: a pass for %s failed", public_endpoint(lane.endpoint)
                )
                wait = self.policy.first_retry_seconds
            if wait > 0 and not self._stopping:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lane.wake.wait(), timeout=wait)

    async def _fill(self, lane: _Lane) -> float:
        """Start what the lane may send now; returns how long to wait before looking again
        (0: look again at once; a finished send or an enqueue wakes the lane sooner)."""
        now = self._clock()
        allowed = lane.breaker.allowance(now, self.policy.in_flight_per_endpoint)
        free = allowed - len(lane.sending)
        if allowed == 0:
            return max(lane.breaker.next_change_at() - now, 0.01)
        if free <= 0:
            return self.policy.poll_seconds  # a send finishing wakes the lane
        rows = await self._claim(lane.endpoint, now, free)
        if rows is None:
            return self.policy.poll_seconds  # until a secret exists
        token, signing, claimed = rows
        for row in claimed:
            send = asyncio.create_task(self._send(lane, row, token, signing))
            lane.sending.add(send)
            send.add_done_callback(functools.partial(_finished, lane))
        if len(claimed) == free:
            return 0.0  # maybe more is due: look again once a slot frees
        due = await asyncio.to_thread(self.backend.next_due_at, lane.endpoint)
        wait = self.policy.poll_seconds
        if due is not None:
            wait = min(wait, due - self._clock())
        return max(wait, 0.01)

    async def _claim(
        self, endpoint: str, now: float, limit: int
    ) -> tuple[str, list[str], list[WebhookDelivery]] | None:
        """Up to ``limit`` due rows of ``endpoint``, claimed, with the claim's token and the
        secrets to sign with; None while no secret exists (the rows wait for one)."""
        signing = await self._signing_secrets()
        if not signing:
            if self._unsigned_since is None:
                self._unsigned_since = self._clock()
                log.warning(
                    "webhooks are owed but no secret is set: set REVEILLE_WEBHOOK_SECRET "
                    "or run `reveille webhooks secret`; they are kept until then"
                )
            return None
        self._unsigned_since = None
        token = secrets.token_hex(16)
        p = self.policy
        claimed = await asyncio.to_thread(
            self.backend.claim_due,
            now,
            self.consumer,
            token,
            p.lease_seconds,
            limit,
            endpoint=endpoint,
        )
        return token, signing, claimed

    async def send_due(self) -> int:
        """Send what is due now, every endpoint in turn, outside the lanes, and wait for the
        answers; returns the rows sent (0 while no secret signs)."""
        sent = 0
        for endpoint in self.urls:
            while not self._stopping:
                lane = _Lane(endpoint, Breaker())
                claim = await self._claim(
                    endpoint, self._clock(), self.policy.in_flight_per_endpoint
                )
                if claim is None or not claim[2]:
                    break
                token, signing, rows = claim
                await asyncio.gather(*(self._send(lane, row, token, signing) for row in rows))
                sent += len(rows)
        return sent

    async def _signing_secrets(self) -> list[str]:
        if self.secret:
            return [self.secret]
        found = await asyncio.to_thread(self.backend.secrets, self._clock())
        return [s.secret for s in found]

    async def _send(
        self, lane: _Lane, row: WebhookDelivery, token: str, signing: list[str]
    ) -> None:
        started = self._clock()
        answer = await self._post(row, signing)
        settlement, outcome = self._judge(row, answer, started)
        self._count(lane, answer)
        attempt = WebhookAttempt(
            row.id, row.endpoint, started, self.consumer, outcome, answer.status, answer.error
        )
        kept = await asyncio.to_thread(self.backend.settle, attempt, token, settlement)
        if not kept:
            log.warning(
                "webhook %s to %s: the claim ran out before it settled",
                row.id,
                public_endpoint(row.endpoint),
            )

    def _count(self, lane: _Lane, answer: _Answer) -> None:
        """The breaker's view of one answer, and the log line when the endpoint trips or
        recovers (once each, not per failure)."""
        now = self._clock()
        status = answer.status
        # 2xx, or an endpoint that answered 410 (it is up); a row dropped because its retry
        # window ran out after another failure is still a failure of the endpoint
        ok = status is not None and (200 <= status < 300 or status == 410)
        change = lane.breaker.record(ok, now, answer.retry_after)
        if change == TRIPPED:
            log.warning(
                "webhook endpoint %s tripped after %d failures in a row (last: %s); its rows "
                "stay owed and it is tried again in %.0f s",
                public_endpoint(lane.endpoint),
                lane.breaker.failed_in_a_row,
                _describe(answer),
                max(lane.breaker.reopen_at - now, 0.0),
            )
        elif change == RECOVERED:
            log.warning(
                "webhook endpoint %s recovered: sending again", public_endpoint(lane.endpoint)
            )

    async def _post(self, row: WebhookDelivery, signing: list[str]) -> _Answer:
        assert self._http is not None
        timestamp = int(self._clock())
        headers = {
            "content-type": "application/json",
            "user-agent": "Reveille-Webhooks",
            "accept-encoding": "identity",
            "webhook-id": row.id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signature_header(signing, row.id, timestamp, row.body),
        }
        try:
            async with self._http.post(
                row.endpoint, data=row.body.encode(), headers=headers, allow_redirects=False
            ) as resp:
                if not await _read_capped(resp.content, self.policy.answer_cap_bytes):
                    # Whatever is left stays unread: dropping the connection is cheaper than
                    # reading a receiver's megabytes to reuse it.
                    resp.close()
                retry_after = None
                if resp.status in (429, 503):
                    retry_after = _retry_after(resp.headers.get("retry-after"), self._clock())
                    if retry_after is not None:
                        retry_after = min(retry_after, self.policy.max_retry_seconds)
                return _Answer(resp.status, None if resp.status < 300 else resp.reason, retry_after)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            return _Answer(None, f"{type(exc).__name__}: {exc}"[:300])

    def _judge(self, row: WebhookDelivery, answer: _Answer, now: float) -> tuple[Settlement, str]:
        status = answer.status
        if status is not None and 200 <= status < 300:
            return Settlement(DELIVERED, reason=f"HTTP {status}"), "delivered"
        if status == 410:
            return Settlement(DROPPED, reason="HTTP 410 Gone: the endpoint stopped it"), "dropped"
        retry_at = now + max(self.policy.retry_delay(row.attempts + 1), answer.retry_after or 0)
        if retry_at - row.created_at > self.policy.max_age_seconds:
            hours = self.policy.max_age_seconds / 3600
            reason = f"no 2xx within {hours:g} h; last: {_describe(answer)}"
            return Settlement(DROPPED, reason=reason), "dropped"
        return Settlement(PENDING, next_attempt_at=retry_at), "retry"


def _finished(lane: _Lane, task: asyncio.Task[None]) -> None:
    lane.sending.discard(task)
    lane.wake.set()  # a slot is free
    if not task.cancelled() and task.exception() is not None:
        log.error(
            "webhook send to %s failed", public_endpoint(lane.endpoint), exc_info=task.exception()
        )


async def _read_capped(content: aiohttp.StreamReader, cap: int) -> bool:
    """Read and discard up to ``cap`` bytes of an answer; True when that was all of it."""
    seen = 0
    while seen <= cap:
        chunk = await content.read(cap + 1 - seen)
        if not chunk:
            return True
        seen += len(chunk)
    return False


def _retry_after(value: str | None, now: float) -> float | None:
    """A ``Retry-After`` header's wait in seconds (delay-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(min(int(value[:12]), 10**9))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        return None
    return max(when.timestamp() - now, 0.0)


def public_endpoint(url: str) -> str:
    """An endpoint as logs and metrics show it: no credentials, query or fragment (they may
    hold a token the receiver checks)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparsable url>"
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _describe(answer: _Answer) -> str:
    return f"HTTP {answer.status}" if answer.status is not None else str(answer.error)
