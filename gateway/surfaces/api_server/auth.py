"""Bearer-key authentication of the API server's port, checked by the port's one middleware.

Every route of the port goes through ``ApiKeyAuth.check`` before its handler runs, so
no handler can forget the check and a refused request reads no body:

- With a configured key (``API_SERVER_KEY``), a request without ``Authorization: Bearer
  <key>`` (compared in constant time) is answered 401 ``invalid_api_key`` in the OpenAI
  error shape. ``/health``, ``/livez`` and ``/readyz`` are the exception: anyone may learn
  that the server is up and ready, and only a key holder learns what it runs or why not.
- Without one, the server binds loopback only, and it answers loopback ``Host`` names only
  (403 ``host_refused`` otherwise): a web page whose name was rebound to 127.0.0.1 would
  otherwise read every transcript. A request is *keyed* only when it presents the
  internal key: a secret only this process knows, which its own wake-ups
  (``gateway.wake``'s self-POST) send. Continuing a session by id needs a keyed request.

Handlers read the outcome with ``is_keyed(request)``. Routes that authenticate themselves
in their own way (a Telegram webhook's secret token) are registered as ``public``.

One gate per surface: a keyless server is not keyed, so it shows API sessions only (not
the web UI's, which has its own password, nor a chat platform's: ``visible_to``). A bearer
token a client sends to a keyless server is its *owner key* (``owner_of``): what it creates
that can be named by id later (a response, its session) is bound to it, and needs it again
(``may_see``); a keyed request (the configured key, the internal one) sees everything.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from gateway.config import Platform
from gateway.http.middleware import ApiError, host_name, is_loopback

__all__ = ["ApiKeyAuth", "is_keyed", "may_see", "owner_of", "same_secret", "visible_to"]

# (web.RequestKey from aiohttp 3.11 on; a plain string key before.)
_KEYED: Any = (
    web.RequestKey("reveille_keyed", bool) if hasattr(web, "RequestKey") else "reveille_keyed"
)
_OWNER: Any = (
    web.RequestKey("reveille_owner", str) if hasattr(web, "RequestKey") else "reveille_owner"
)
# Owner keys are stored as this prefix and a hash: never the token itself.
OWNER_PREFIX = "key:"
# Anyone may learn that the server is up and ready, never what it runs (see ``_health``).
_HEALTH = frozenset({"/health", "/livez", "/readyz"})


def same_secret(a: str, b: str) -> bool:
    """Constant-time comparison of two secrets (their lengths may differ)."""
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


def bearer_token(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def is_keyed(request: web.Request) -> bool:
    """Whether the request presented the configured key (or, without one, the internal)."""
    return bool(request.get(_KEYED, False))


def owner_of(request: web.Request) -> str | None:
    """The owner key of a keyless server's request that sent a bearer token (a hash of it);
    None for a keyed request or one without a token."""
    owner = request.get(_OWNER)
    return owner if isinstance(owner, str) else None


def may_see(request: web.Request, owner: str | None) -> bool:
    """Whether ``request`` may see what the owner key ``owner`` created (None: nobody's)."""
    if owner is None or is_keyed(request):
        return True
    mine = owner_of(request)
    return mine is not None and same_secret(mine, owner)


def visible_to(request: web.Request, source: Mapping[str, Any] | None) -> bool:
    """Whether a session with this stored ``SessionSource`` is the request's to see: every
    one for a keyed request; otherwise an API session (a record without a source is one)
    that no other owner key holds."""
    if is_keyed(request):
        return True
    source = source or {}
    if str(source.get("platform") or Platform.API_SERVER.value) != Platform.API_SERVER.value:
        return False
    user = source.get("user_id")
    held = user if isinstance(user, str) and user.startswith(OWNER_PREFIX) else None
    return may_see(request, held)


class ApiKeyAuth:
    """The API port's key check (see the module docstring)."""

    def __init__(self, configured_key: str = "", *, internal_key: str | None = None) -> None:
        self.configured_key = configured_key
        # What this process's own wake-ups present: the configured key when there is one,
        # otherwise a secret nobody else can know.
        self.internal_key = (
            configured_key or internal_key or "internal-" + secrets.token_urlsafe(32)
        )
        self._public: set[str] = set()

    def public(self, path: str) -> None:
        """Let ``path`` through unauthenticated: its handler checks a secret of its own.
        A path ending in ``/`` lets through every path one segment below it (``/v1/hooks/``:
        each hook verifies its own signature, and an unknown one answers 404)."""
        self._public.add(path)

    def _is_public(self, path: str) -> bool:
        if path in self._public:
            return True
        head, _, last = path.rpartition("/")
        return bool(last) and f"{head}/" in self._public

    def check(self, request: web.Request) -> None:
        """Authenticate ``request`` (raises the ``ApiError`` that refuses it): the port's
        middleware (``gateway.http.middleware.PortMiddleware``) calls it before the handler."""
        path = request.path
        if self._is_public(path):
            return
        token = bearer_token(request)
        if self.configured_key:
            keyed = token is not None and same_secret(token, self.configured_key)
            if not keyed and path not in _HEALTH:
                raise ApiError(
                    401,
                    "Invalid API key. Send it as 'Authorization: Bearer <API_SERVER_KEY>'.",
                    code="invalid_api_key",
                )
        else:
            if not is_loopback(host_name(request.host)):
                raise ApiError(
                    403,
                    "address this server as 127.0.0.1 or localhost (it has no API key, so it "
                    "answers loopback names only)",
                    code="host_refused",
                )
            keyed = token is not None and same_secret(token, self.internal_key)
            if token is not None and not keyed:
                digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()
                request[_OWNER] = OWNER_PREFIX + digest[:40]
        request[_KEYED] = keyed

    @web.middleware
    async def middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """``check`` as a middleware of its own (inside ``error_middleware``), for an app
        that is not the API port."""
        self.check(request)
        return await handler(request)
