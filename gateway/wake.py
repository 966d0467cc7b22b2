"""Wake delivery: bring a finished background job back into the conversation that started it.

Two strategies, chosen by the adapter's ``supports_async_delivery``:

* push-capable adapters get a synthetic ``MessageEvent(internal=True)`` through
  ``handle_message`` — the same path a user message takes;
* the stateless API server has no way to push, so the wake is self-POSTed to its own
  ``/v1/chat/completions`` with the RAW session id, resuming the real session instead of a
  parallel invisible one keyed by ``build_session_key``.

The texts themselves are written by ``gateway.wake_text`` (``format_wake_text``, re-exported
here). Delegation results for API-server sessions are not self-posted at all (the client owns the
next turn and a self-post could cross a pending human confirmation): they are persisted as a
delivery row with ``persist_delegation_delivery`` and folded in by the next client turn.

Every failure raises, so the caller releases its ledger claim instead of losing the event.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, overload

import aiohttp

from delivery import traces
from delivery.event_display import display_metadata
from delivery.events import (
    ASYNC_DELEGATION,
    AbandonedWork,
    CompletionEvent,
    InboundWakeupEvent,
    ScheduledWakeupEvent,
    parse_event,
    transcript_key,
)
from gateway.adapter import MessageEvent, MessageType
from gateway.session import MessageRecord, SessionSource, SessionStore, is_valid_session_id

# The rendering lives in gateway.wake_text; these names stay importable from here.
from gateway.wake_text import delegation_counts, format_wake_text

__all__ = [
    "DEFAULT_API_SERVER_PORT",
    "DEFAULT_WAKE_TIMEOUT_SECONDS",
    "DELEGATION_DISPLAY_KIND",
    "INBOUND_DISPLAY_KIND",
    "WAKEUP_DISPLAY_KIND",
    "WakeDeliveryError",
    "adapter_supports_push",
    "delegation_counts",
    "deliver_wake",
    "format_wake_text",
    "persist_delegation_delivery",
    "persist_wakeup_delivery",
    "url_host",
]

logger = logging.getLogger(__name__)

# Read at call time (tests shrink it): waits before the 2nd, 3rd and 4th attempt.
_RETRY_DELAYS_SECONDS: Sequence[float] = (2, 5, 10)

DEFAULT_API_SERVER_PORT = 8642
# Overall budget of one deliver_wake self-post, retries included. Kept below the ledger's
# 300 s claim lease so the caller still holds its claim when we give up and can release it,
# instead of the lease lapsing and a second consumer claiming the same row meanwhile.
DEFAULT_WAKE_TIMEOUT_SECONDS = 240.0

DELEGATION_DISPLAY_KIND = "async_delegation_complete"
# A wake-up the agent set came due (``schedule_wakeup``): its own kind of delivery row.
WAKEUP_DISPLAY_KIND = "scheduled_wakeup"
# An inbound event (``POST /v1/hooks/{name}``) came, or a wait for one expired.
INBOUND_DISPLAY_KIND = "inbound_event"
MISSED_DISPLAY_KIND = "schedule_missed"  # an occurrence its misfire policy did not run

# Gateways answering these are restarting or overloaded, not rejecting the request.
_TRANSIENT_HTTP = frozenset({502, 503, 504})


class WakeDeliveryError(RuntimeError):
    """A wake could not be delivered. ``transient`` tells the caller whether a later retry
    may succeed (release retryable) or the target refused it for good."""

    def __init__(self, message: str, *, transient: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status


def adapter_supports_push(adapter: Any) -> bool:
    """Whether the adapter can inject a turn itself; adapters predating the flag can."""
    return bool(getattr(adapter, "supports_async_delivery", True))


# --------------------------------------------------------------------------- delivery


def url_host(bind_host: str) -> str:
    """The host part of a URL that reaches, from this machine, a server bound to ``bind_host``.

    A wildcard bind accepts on loopback, and loopback never leaves the machine with the
    bearer key; the address family the server was bound with is kept. IPv6 literals come
    back in brackets.
    """
    host = bind_host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        host = "127.0.0.1"
    else:
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            addr = None  # a hostname: connect to it as configured
        if addr is not None and addr.is_unspecified:
            host = "::1" if addr.version == 6 else "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _self_post_url(adapter: Any) -> str:
    host = url_host(str(getattr(adapter, "_host", "") or ""))
    port = int(getattr(adapter, "_port", 0) or DEFAULT_API_SERVER_PORT)
    return f"http://{host}:{port}/v1/chat/completions"


async def _read_json_object(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    raw = await resp.read()
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        data = None
    if not isinstance(data, dict):
        # The turn was accepted (2xx); raising would make the caller redeliver a wake that
        # already ran. Report it and return an empty result instead.
        logger.warning("wake self-post returned HTTP %s with a non-object body", resp.status)
        return {}
    return data


async def _error_detail(resp: aiohttp.ClientResponse) -> str:
    try:
        text = (await resp.text(errors="replace")).strip()
    except (aiohttp.ClientError, TimeoutError):
        return ""
    # Error bodies only, for diagnostics; results are never truncated anywhere.
    return text[:300]


async def deliver_wake(
    adapter: Any,
    *,
    text: str,
    source: SessionSource | None = None,
    session_id: str | None = None,
    idempotency_key: str | None = None,
    timeout: float = DEFAULT_WAKE_TIMEOUT_SECONDS,
) -> dict[str, Any] | None:
    """Deliver ``text`` as a new turn of the originating session.

    Push adapters: needs ``source``; awaits ``adapter.handle_message`` and returns None.
    Stateless adapters: needs the raw ``session_id``; self-POSTs ``/v1/chat/completions``
    and returns the parsed JSON response, with ``requested_session_id``,
    ``effective_session_id`` and ``completion`` (the response itself) added for callers that
    read hermes-agent's newer shape. ``idempotency_key`` (use the delivery id) is sent
    as ``Idempotency-Key`` on every attempt, so a retry whose first attempt actually ran
    never starts a second turn. ``timeout`` bounds the whole self-post including retries.

    Raises ValueError for missing routing data, RuntimeError (``WakeDeliveryError`` for
    HTTP/connection failures, with ``transient``) when the wake was not delivered.
    """
    if adapter_supports_push(adapter):
        if source is None:
            raise ValueError("deliver_wake: a push-capable adapter needs the SessionSource")
        event = MessageEvent(
            text=text,
            message_type=MessageType.TEXT,
            source=source,
            internal=True,
            session_id=session_id,
        )
        if idempotency_key:
            # Lets adapters that persist inbound events drop a redelivered wake.
            event.metadata["idempotency_key"] = idempotency_key
        await adapter.handle_message(event)
        return None

    if not session_id:
        raise ValueError(
            "deliver_wake: the API server is stateless; a wake needs the raw session_id"
        )
    if timeout <= 0:
        raise ValueError("deliver_wake: timeout must be positive")
    if not is_valid_session_id(session_id):
        raise ValueError(f"deliver_wake: malformed session id {session_id!r}")
    api_key = str(getattr(adapter, "_api_key", "") or "")
    if not api_key:
        raise RuntimeError(
            "deliver_wake: API_SERVER_KEY is not set; the API server refuses session "
            "continuation without it, so the wake cannot resume the session"
        )

    url = _self_post_url(adapter)
    headers = {
        "Authorization": f"Bearer {api_key}",
        "X-Hermes-Session-Id": session_id,
        # One key for all attempts of this call: that is what makes a retry safe.
        "Idempotency-Key": idempotency_key or f"wake_{uuid.uuid4().hex}",
    }
    wake_token = getattr(adapter, "_wake_token", None)
    if isinstance(wake_token, str) and wake_token:
        # Puts the key in the server's own namespace, which no client can claim first.
        headers["X-Reveille-Wake-Token"] = wake_token
    traces.carry_current(headers)  # the wake-up turn's span is the delivery's child
    body = {
        "model": getattr(adapter, "_model_name", None) or "reveille",
        "messages": [{"role": "user", "content": text}],
        "stream": False,
    }
    delays = tuple(_RETRY_DELAYS_SECONDS)
    attempts = len(delays) + 1
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last_problem = "no attempt made"
    last_status: int | None = None
    made = 0

    # trust_env=False (the default) on purpose: an HTTP(S)_PROXY must not reroute a
    # loopback self-post carrying the bearer key.
    async with aiohttp.ClientSession() as http:
        for attempt in range(attempts):
            if attempt:
                delay = delays[attempt - 1]
                if loop.time() + delay >= deadline:
                    last_problem += f" (timeout budget of {timeout:g}s exhausted)"
                    break
                await asyncio.sleep(delay)
            remaining = max(deadline - loop.time(), 0.001)
            made += 1
            try:
                async with http.post(
                    url,
                    json=body,
                    headers=headers,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=remaining),
                ) as resp:
                    status = resp.status
                    if 200 <= status < 300:
                        completion = await _read_json_object(resp)
                        # The completion's own keys, plus the shape newer hermes front ends
                        # read: which session was asked for, which one answered.
                        return {
                            **completion,
                            "requested_session_id": session_id,
                            "effective_session_id": resp.headers.get(
                                "X-Hermes-Session-Id", session_id
                            ),
                            "completion": completion,
                        }
                    detail = await _error_detail(resp)
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
                last_problem = f"{type(exc).__name__}: {exc}".rstrip(": ")
                last_status = None
                logger.warning(
                    "wake self-post to %s failed (attempt %d/%d): %s",
                    url,
                    attempt + 1,
                    attempts,
                    last_problem,
                )
                continue
            if status == 429:
                # max_concurrent_runs is full: a wait state, not a refusal.
                last_problem = "HTTP 429 (server busy)"
                last_status = status
                logger.info(
                    "wake self-post to %s got HTTP 429 (attempt %d/%d)", url, attempt + 1, attempts
                )
                continue
            raise WakeDeliveryError(
                f"wake self-post to {url} failed: HTTP {status}"
                + (f": {detail}" if detail else ""),
                transient=status in _TRANSIENT_HTTP,
                status=status,
            )
    raise WakeDeliveryError(
        f"gave up delivering wake to {url} after {made} attempt(s): {last_problem}",
        transient=True,
        status=last_status,
    )


# --------------------------------------------------------------------------- persistence


@overload
def persist_delegation_delivery(
    store: SessionStore,
    session_id: str,
    evt: Mapping[str, Any] | CompletionEvent,
    text: str | None = None,
) -> MessageRecord: ...


@overload
def persist_delegation_delivery(
    store: Any,
    session_id: str | None = None,
    evt: Mapping[str, Any] | CompletionEvent | None = None,
    text: str | None = None,
    *,
    profile: str = "",
) -> Any: ...


def persist_delegation_delivery(
    store: Any,
    session_id: str | None = None,
    evt: Mapping[str, Any] | CompletionEvent | None = None,
    text: str | None = None,
    *,
    profile: str = "",
) -> Any:
    """Append a delegation result to an API-server session transcript as a delivery row.

    Two call shapes. This tree's: ``persist_delegation_delivery(store, session_id, evt,
    text)``, synchronous, returns the row. hermes-agent's:
    ``await persist_delegation_delivery(adapter, text=..., session_id=..., evt=...)`` with
    an adapter that has a ``store``: returns an awaitable that writes the row off the event
    loop (``profile`` is accepted and has no meaning here).
    """
    if not isinstance(store, SessionStore):
        target = getattr(store, "store", None)
        if not isinstance(target, SessionStore):
            raise TypeError(
                "persist_delegation_delivery needs a SessionStore or an adapter with a .store"
            )
        if not session_id or evt is None:
            raise ValueError("persist_delegation_delivery needs session_id= and evt=")
        return asyncio.to_thread(_persist_delegation_delivery, target, session_id, evt, text)
    if session_id is None or evt is None:
        raise ValueError("persist_delegation_delivery needs a session id and the event")
    return _persist_delegation_delivery(store, session_id, evt, text)


def _persist_delegation_delivery(
    store: SessionStore,
    session_id: str,
    evt: Mapping[str, Any] | CompletionEvent,
    text: str | None = None,
) -> MessageRecord:
    """Append a delegation result to an API-server session transcript as a delivery row.

    The row (role "system", ``display_kind="async_delegation_complete"``) is shown by
    ``GET /api/sessions/{id}/messages`` and folded into the next client turn by
    ``SessionStore.abegin_turn`` (exactly once). Its dedupe key is ``deleg:<delegation_id>``,
    so a redelivered event returns the existing row instead of appending twice. Raises
    SessionGone for an unknown session (the caller drops or releases its claim).
    """
    if isinstance(evt, Mapping) and "type" not in evt:
        evt = {**evt, "type": ASYNC_DELEGATION}  # untyped dicts were always read as delegations
    event = parse_event(evt)
    if event.type != ASYNC_DELEGATION:
        kind = evt.get("type") if isinstance(evt, Mapping) else type(evt).__name__
        raise ValueError(f"persist_delegation_delivery: not a delegation event ({kind!r})")
    work = event.work if isinstance(event, AbandonedWork) else event
    delegation_id = getattr(work, "delegation_id", None)
    if not delegation_id:
        # Without an id there is no dedupe key, and a redelivery would append twice.
        raise ValueError("persist_delegation_delivery: event has no delegation_id")
    content = text if text is not None else format_wake_text(event)
    return store.append_message(
        session_id,
        "system",
        content,
        display_kind=DELEGATION_DISPLAY_KIND,
        # The structured summary (kind, goal(s), counts, status, result preview ...) that
        # front ends show instead of reading the text.
        display_metadata=display_metadata(event),
        dedupe_key=transcript_key(delegation_id),
    )


def persist_wakeup_delivery(
    store: SessionStore, session_id: str, event: ScheduledWakeupEvent, text: str | None = None
) -> MessageRecord:
    """Append a wake-up that came due to an API-server session transcript as a delivery row
    (``display_kind="scheduled_wakeup"``), folded into the next client turn like a
    delegation's result. Keyed by the timer's ledger id, so a redelivered firing returns the
    existing row instead of appending twice. Raises SessionGone for an unknown session."""
    if not event.delivery_id:
        raise ValueError("persist_wakeup_delivery: event has no delivery_id")
    return store.append_message(
        session_id,
        "system",
        text if text is not None else format_wake_text(event),
        display_kind=INBOUND_DISPLAY_KIND
        if isinstance(event, InboundWakeupEvent)
        else MISSED_DISPLAY_KIND
        if event.status == "missed"
        else WAKEUP_DISPLAY_KIND,
        display_metadata=display_metadata(event),
        dedupe_key=transcript_key(event.delivery_id),
    )
