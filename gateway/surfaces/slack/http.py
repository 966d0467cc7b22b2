"""Slack's HTTP delivery: the Events API (``POST /slack/events``) and interactivity
(``POST /slack/interactivity``), mounted on the API server's port as public routes (each
request authenticates itself by its signature, not the API key).

Every request is checked before anything of it is used (``verify``): its body at most
``MAX_BODY_BYTES``; ``X-Slack-Request-Timestamp`` within ``REPLAY_WINDOW_SECONDS`` of now
(a request recorded and sent again later is refused); ``X-Slack-Signature`` equal, in
constant time, to ``v0=`` + HMAC-SHA256 of ``v0:{timestamp}:{body}`` under the signing
secret. A refused request is a 401 (413 too large, 400 not JSON / not UTF-8) and is never
stored.

* Events: ``url_verification`` answers its ``challenge``; an ``event_callback`` goes to
  ``take`` (stored in the inbox by its ``event_id`` and only then answered 200, so an event
  Slack saw accepted is durable). Slack sends an event again (``X-Slack-Retry-Num``) when
  it saw no 200 in 3 seconds; the inbox takes each ``event_id`` once, so a re-sent event,
  and a signed request replayed within the window, is answered once.
* Interactivity: the form field ``payload`` (JSON) goes to ``press`` (stored in the inbox by
  its stable id, and only then answered 200, so a press Slack saw accepted is durable; the
  press is decided meanwhile, and told to the presser by the adapter).
* Slash commands (``POST /slack/commands``): the form's fields go to ``command``, whose
  answer is the response's body (shown to the user who typed it only).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs

from aiohttp import web

from agent.messages import JSONObject, JSONValue
from gateway.surfaces.slack.intake import clean

__all__ = [
    "MAX_BODY_BYTES",
    "REPLAY_WINDOW_SECONDS",
    "Handler",
    "commands_handler",
    "events_handler",
    "interactivity_handler",
    "sign",
    "verify",
]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 256 * 1024
REPLAY_WINDOW_SECONDS = 300.0

Handler = Callable[[web.Request], Awaitable[web.Response]]


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Slack-Signature`` of ``body`` sent at ``timestamp``."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def verify(
    secret: str, timestamp: str, signature: str, body: bytes, *, now: float | None = None
) -> str | None:
    """None when the request is Slack's (see the module docstring), else why not."""
    try:
        sent_at = int(timestamp)
    except ValueError:
        return "no timestamp"
    if abs((time.time() if now is None else now) - sent_at) > REPLAY_WINDOW_SECONDS:
        return "timestamp outside the replay window"
    expected = sign(secret, str(sent_at), body).encode()
    # Compared as the bytes that came: a header that is not ASCII is no signature.
    given = signature.encode("utf-8", "surrogateescape")
    if not hmac.compare_digest(given, expected):
        return "bad signature"
    return None


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


async def _signed_body(request: web.Request, secret: str) -> bytes:
    """The body of a request Slack signed, or ``_Refused``."""
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise _Refused(413, "too large")
    body = b""
    while chunk := await request.content.read(64 * 1024):
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _Refused(413, "too large")
    headers = request.headers
    stamps = headers.getall("X-Slack-Request-Timestamp", [])
    sigs = headers.getall("X-Slack-Signature", [])
    if len(stamps) != 1 or len(sigs) != 1:
        raise _Refused(401, "unsigned")
    why = verify(secret, stamps[0], sigs[0], body)
    if why is not None:
        raise _Refused(401, why)
    return body


def _json(text: bytes | str) -> JSONObject:
    try:
        data = json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except (ValueError, RecursionError):
        raise _Refused(400, "not JSON") from None
    if not isinstance(data, dict):
        raise _Refused(400, "not a JSON object")
    cleaned = clean(data)
    assert isinstance(cleaned, dict)
    return cleaned


def _refusal(exc: _Refused, what: str) -> web.Response:
    logger.warning("Slack %s refused (%d): %s", what, exc.status, exc.reason)
    return web.json_response({"ok": False, "error": exc.reason}, status=exc.status)


def events_handler(secret: str, take: Callable[[JSONObject], Awaitable[None]]) -> Handler:
    """The handler Slack POSTs events to (see the module docstring)."""
    if not secret:
        raise ValueError("the Events API needs the signing secret")

    async def handle(request: web.Request) -> web.Response:
        try:
            body = _json(await _signed_body(request, secret))
        except _Refused as exc:
            return _refusal(exc, "event")
        kind = body.get("type")
        if kind == "url_verification":
            return web.json_response({"challenge": body.get("challenge")})
        if kind == "event_callback":
            retry = request.headers.get("X-Slack-Retry-Num")
            if retry:
                logger.info(
                    "Slack: event %s sent again (retry %s: %s)",
                    body.get("event_id"),
                    retry,
                    request.headers.get("X-Slack-Retry-Reason", "?"),
                )
            await take(body)
        return web.json_response({"ok": True})

    return handle


async def _form(request: web.Request, secret: str) -> dict[str, str]:
    """The fields (one value each) of a form Slack signed, or ``_Refused``."""
    raw = await _signed_body(request, secret)
    try:
        form = parse_qs(raw.decode("utf-8"), strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        raise _Refused(400, "not a form") from None
    fields = {k: v[0] for k, v in form.items() if len(v) == 1}
    cleaned = clean(dict[str, JSONValue](fields))
    assert isinstance(cleaned, dict)
    return {k: v for k, v in cleaned.items() if isinstance(v, str)}


def commands_handler(
    secret: str, command: Callable[[JSONObject], Awaitable[JSONObject]]
) -> Handler:
    """The handler Slack POSTs slash commands to (see the module docstring)."""
    if not secret:
        raise ValueError("slash commands need the signing secret")

    async def handle(request: web.Request) -> web.Response:
        try:
            fields = await _form(request, secret)
        except _Refused as exc:
            return _refusal(exc, "command")
        return web.json_response(await command(dict[str, JSONValue](fields)))

    return handle


def interactivity_handler(secret: str, press: Callable[[JSONObject], Awaitable[None]]) -> Handler:
    """The handler Slack POSTs button presses to (see the module docstring)."""
    if not secret:
        raise ValueError("interactivity needs the signing secret")

    async def handle(request: web.Request) -> web.Response:
        try:
            payload = (await _form(request, secret)).get("payload")
            if payload is None:
                raise _Refused(400, "no payload")
            data = _json(payload)
        except _Refused as exc:
            return _refusal(exc, "interaction")
        await press(data)
        return web.Response(status=200)

    return handle
