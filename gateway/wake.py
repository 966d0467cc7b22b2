"""Wake delivery: bring a finished background job back into the conversation that started it.

Two strategies, chosen by the adapter's ``supports_async_delivery``:

* push-capable adapters get a synthetic ``MessageEvent(internal=True)`` through
  ``handle_message`` — the same path a user message takes;
* the stateless API server has no way to push, so the wake is self-POSTed to its own
  ``/v1/chat/completions`` with the RAW session id, resuming the real session instead of a
  parallel invisible one keyed by ``build_session_key``.

Delegation results for API-server sessions are not self-posted at all (the client owns the
next turn and a self-post could cross a pending human confirmation): they are persisted as a
delivery row with ``persist_delegation_delivery`` and folded in by the next client turn.

Every failure raises, so the caller releases its ledger claim instead of losing the event.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import aiohttp

from agent.markers import WAKE_MARKER
from gateway.platforms.base import MessageEvent, MessageType
from gateway.session import SessionSource, SessionStore, is_valid_session_id

__all__ = [
    "DEFAULT_API_SERVER_PORT",
    "DEFAULT_WAKE_TIMEOUT_SECONDS",
    "DELEGATION_DISPLAY_KIND",
    "WakeDeliveryError",
    "adapter_supports_push",
    "delegation_counts",
    "deliver_wake",
    "format_wake_text",
    "persist_delegation_delivery",
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

# Gateways answering these are restarting or overloaded, not rejecting the request.
_TRANSIENT_HTTP = frozenset({502, 503, 504})
_SUCCESS_STATUSES = frozenset({"completed", "success", "succeeded", "ok", "done"})
_ABNORMAL_STATUSES = frozenset({"interrupted", "unknown", "stalled", "cancelled", "error"})


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
    and returns the parsed JSON response. ``idempotency_key`` (use the delivery id) is sent
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
                        return await _read_json_object(resp)
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


# --------------------------------------------------------------------------- formatting


def _parse_time(value: Any) -> datetime | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        if isinstance(value, int | float):
            return datetime.fromtimestamp(float(value), tz=UTC)
        if isinstance(value, str):
            text = value.strip()
            try:
                return datetime.fromtimestamp(float(text), tz=UTC)
            except ValueError:
                pass
            dt = datetime.fromisoformat(text)
            # Reveille writes UTC; a naive stamp is read the same way rather than as local.
            return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)
    except (ValueError, OverflowError, OSError):
        return None
    return None


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _human_duration(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return str(value)
    if seconds < 0:
        return f"{seconds:g}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h {minutes:02d}m"
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    return f"{minutes}m {secs:02d}s"


def _when(value: Any, now: float) -> str:
    dt = _parse_time(value)
    if dt is None:
        return str(value)
    ago = now - dt.timestamp()
    if ago < 0:
        return f"{_iso(dt)} (in the future by {_human_duration(-ago)}; clock skew?)"
    if ago < 1:
        return f"{_iso(dt)} (just now)"
    return f"{_iso(dt)} ({_human_duration(ago)} ago)"


def _field(label: str, value: Any) -> str:
    text = value if isinstance(value, str) else _render_value(value)
    # Multi-line values go below their label so the text stays readable.
    return f"{label}:\n{text}" if "\n" in text else f"{label}: {text}"


def _render_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return str(value)


def _present(value: Any) -> bool:
    return value is not None and value != "" and value != [] and value != {}


def _is_batch(evt: Mapping[str, Any]) -> bool:
    return bool(evt.get("is_batch")) or isinstance(evt.get("results"), list)


def _is_success(status: Any) -> bool:
    return isinstance(status, str) and status.strip().lower() in _SUCCESS_STATUSES


def _goals(evt: Mapping[str, Any]) -> list[str]:
    goals = evt.get("goals")
    if isinstance(goals, list | tuple):
        return [str(g) for g in goals]
    goal = evt.get("goal")
    return [str(goal)] if _present(goal) else []


def delegation_counts(evt: Mapping[str, Any]) -> dict[str, int]:
    """``{"tasks", "completed", "failed"}`` for a delegation event.

    A single delegation is one task. For a batch, tasks come from ``results[]`` (or the
    goals when results are missing); anything that did not complete counts as failed.
    """
    if _is_batch(evt):
        results = evt.get("results")
        results = results if isinstance(results, list) else []
        tasks = len(results) or len(_goals(evt))
        completed = sum(
            1 for r in results if isinstance(r, Mapping) and _is_success(r.get("status"))
        )
    else:
        tasks = 1
        completed = 1 if _is_success(evt.get("status")) else 0
    return {"tasks": tasks, "completed": completed, "failed": tasks - completed}


def _outcome_lines(item: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    summary, error = item.get("summary"), item.get("error")
    if _present(summary):
        lines.append("Result:\n" + _render_value(summary))
    if _present(error):
        lines.append("Error:\n" + _render_value(error))
    if not lines:
        extra = item.get("result")
        if _present(extra):
            lines.append("Result:\n" + _render_value(extra))
        else:
            lines.append("Result: (no summary or error was returned)")
    return lines


def _common_delegation_lines(evt: Mapping[str, Any], now: float) -> list[str]:
    lines: list[str] = []
    if _present(evt.get("context")):
        lines.append(_field("Context", evt["context"]))
    for key, label in (("role", "Role"), ("model", "Model")):
        if _present(evt.get(key)):
            lines.append(_field(label, evt[key]))
    toolsets = evt.get("toolsets")
    if _present(toolsets):
        joined = ", ".join(map(str, toolsets)) if isinstance(toolsets, list | tuple) else toolsets
        lines.append(_field("Toolsets", joined))
    if _present(evt.get("dispatched_at")):
        lines.append("Dispatched: " + _when(evt["dispatched_at"], now))
    if _present(evt.get("completed_at")):
        lines.append("Completed: " + _when(evt["completed_at"], now))
    return lines


def _format_delegation(evt: Mapping[str, Any], now: float) -> str:
    delegation_id = evt.get("delegation_id") or "(unknown id)"
    status = evt.get("status")
    batch = _is_batch(evt)
    counts = delegation_counts(evt)
    goals = _goals(evt)
    out: list[str] = []

    if batch:
        out.append(
            f"[Background delegation batch finished] {delegation_id}: {counts['tasks']} "
            f"task(s), {counts['completed']} completed, {counts['failed']} failed."
        )
    else:
        out.append(
            f"[Background delegation finished] {delegation_id}: status {status or 'unknown'}."
        )
    out.append(
        "This is an automatic wake-up, not a user message: work you delegated earlier has "
        "ended. It restates what was asked so you can act on it even if you are in the "
        "middle of something else."
    )
    if evt.get("_restored"):
        # Set by the ledger on events it offers again (restart or orphan re-offer).
        out.append("(Re-delivered after a restart or an interrupted delivery.)")
    out.append("")

    if batch:
        out.append("Goals:")
        out.extend(f"  {i}. {goal}" for i, goal in enumerate(goals, 1))
    elif goals:
        out.append(_field("Goal", goals[0]))
    out.extend(_common_delegation_lines(evt, now))
    duration = evt.get("total_duration_seconds") if batch else None
    if duration is None:
        duration = evt.get("duration_seconds")
    if duration is not None:
        out.append(("Total duration: " if batch else "Duration: ") + _human_duration(duration))
    if _present(status):
        out.append(f"Status: {status}")
    if isinstance(status, str) and status.lower() in _ABNORMAL_STATUSES:
        out.append(
            f"Note: the work did not finish normally ({status}); what is known is reported below."
        )
    out.append("")

    if batch:
        raw_results = evt.get("results")
        results: list[Any] = raw_results if isinstance(raw_results, list) else []
        out.append("Results:")
        total = len(results)
        for i, result in enumerate(results):
            out.append("")
            if not isinstance(result, Mapping):
                out.append(f"### Task {i + 1} of {total}")
                out.append(_render_value(result))
                continue
            head = f"### Task {i + 1} of {total}: {result.get('status') or 'unknown'}"
            if result.get("duration_seconds") is not None:
                head += f" ({_human_duration(result['duration_seconds'])})"
            out.append(head)
            goal = result.get("goal") or (goals[i] if i < len(goals) else None)
            if _present(goal):
                out.append(_field("Goal", goal))
            out.extend(_outcome_lines(result))
        if not results:
            out.append("(no per-task results were recorded)")
            out.extend(_outcome_lines(evt))
    else:
        out.extend(_outcome_lines(evt))
    return "\n".join(out).rstrip() + "\n"


def _first_present(evt: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if _present(evt.get(key)):
            return evt[key]
    return None


def _format_process_completion(evt: Mapping[str, Any], now: float) -> str:
    exit_code = _first_present(evt, "exit_code", "returncode", "return_code")
    command = _first_present(evt, "command", "cmd")
    proc_id = _first_present(evt, "process_id", "proc_id", "session_id", "pid")
    duration = _first_present(evt, "duration_seconds", "duration")
    output = _first_present(evt, "output", "output_tail", "tail", "stdout")
    code_text = "unknown" if exit_code is None else str(exit_code)

    out = [
        f"[Background process finished] exit code {code_text}.",
        "This is an automatic wake-up, not a user message: a background command you started "
        "earlier has exited.",
    ]
    if evt.get("_restored"):
        out.append("(Re-delivered after a restart or an interrupted delivery.)")
    out.append("")
    if command is not None:
        out.append(_field("Command", _render_value(command)))
    if proc_id is not None:
        out.append(f"Process: {proc_id}")
    if _present(evt.get("cwd")):
        out.append(f"Working directory: {evt['cwd']}")
    if _present(evt.get("started_at")):
        out.append("Started: " + _when(evt["started_at"], now))
    out.append(f"Exit code: {code_text}")
    if duration is not None:
        out.append("Duration: " + _human_duration(duration))
    out.append("")
    if output is not None:
        out.append("Output (tail):")
        out.append(_render_value(output))
    else:
        out.append("Output: (none captured)")
    return "\n".join(out).rstrip() + "\n"


def _format_generic(evt: Mapping[str, Any]) -> str:
    out = [
        f"[Background event: {evt.get('type') or 'unknown'}]",
        "This is an automatic wake-up, not a user message.",
    ]
    if evt.get("_restored"):
        out.append("(Re-delivered after a restart or an interrupted delivery.)")
    out.append("")
    for key, value in evt.items():
        # "_"-prefixed keys are the ledger's bookkeeping (re-offer marks), not event data.
        if key == "type" or str(key).startswith("_") or value is None:
            continue
        out.append(_field(str(key), value))
    return "\n".join(out).rstrip() + "\n"


def format_wake_text(evt: Mapping[str, Any], *, now: float | None = None) -> str:
    """Self-contained wake-up text for a completion event; results are never truncated.

    The first line starts with ``agent.markers.WAKE_MARKER``.
    ``now`` (epoch seconds) pins the "how long ago" arithmetic for reproducible output.
    """
    current = time.time() if now is None else now
    kind = evt.get("type")
    if kind == "async_delegation":
        text = _format_delegation(evt, current)
    elif kind == "completion":
        text = _format_process_completion(evt, current)
    else:
        text = _format_generic(evt)
    # The marker opens the first line, so models and front ends can tell a wake-up from
    # something the user typed.
    return f"{WAKE_MARKER} {text}"


# --------------------------------------------------------------------------- persistence


def persist_delegation_delivery(
    store: SessionStore,
    session_id: str,
    evt: Mapping[str, Any],
    text: str | None = None,
) -> dict[str, Any]:
    """Append a delegation result to an API-server session transcript as a delivery row.

    The row (role "system", ``display_kind="async_delegation_complete"``) is shown by
    ``GET /api/sessions/{id}/messages`` and folded into the next client turn by
    ``SessionStore.take_unfolded_deliveries``. Its dedupe key is ``deleg:<delegation_id>``,
    so a redelivered event returns the existing row instead of appending twice. Raises
    SessionGone for an unknown session (the caller drops or releases its claim).
    """
    delegation_id = evt.get("delegation_id")
    if not isinstance(delegation_id, str) or not delegation_id:
        # Without an id there is no dedupe key, and a redelivery would append twice.
        raise ValueError("persist_delegation_delivery: event has no delegation_id")
    kind = evt.get("type", "async_delegation")
    if kind != "async_delegation":
        raise ValueError(f"persist_delegation_delivery: not a delegation event ({kind!r})")

    counts = delegation_counts(evt)
    batch = _is_batch(evt)
    status = evt.get("status")
    if not _present(status):
        status = "completed" if counts["failed"] == 0 else "failed"
    metadata: dict[str, Any] = {
        "delegation_id": delegation_id,
        "status": status,
        **counts,
        "is_batch": batch,
        "dispatched_at": evt.get("dispatched_at"),
        "completed_at": evt.get("completed_at"),
    }
    if batch:
        metadata["goals"] = _goals(evt)
    else:
        metadata["goal"] = evt.get("goal")
    content = text if text is not None else format_wake_text(evt)
    return store.append_message(
        session_id,
        "system",
        content,
        display_kind=DELEGATION_DISPLAY_KIND,
        display_metadata=metadata,
        dedupe_key=f"deleg:{delegation_id}",
    )
