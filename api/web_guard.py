"""What the web UI answers before and around every handler: the request checks (loopback
``Host`` without a password, same origin, login, CSRF), the Content-Security-Policy and
hardening headers, the login cookie, and the ``{"error": {...}}`` answer shape.

``api.server.WebUIServer`` installs these; nothing here holds state of its own.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from api.auth import COOKIE_MAX_AGE_SECONDS, COOKIE_NAME, Auth
from gateway.http.middleware import host_name, is_loopback

__all__ = ["error_response", "refusal", "security_headers", "set_login_cookie"]

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src {images}; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
# Images come only from the page's own /static/ folder and inline data: never from an API
# path (an <img src=/api/events> would hold one of the tab's connections for good) or a
# remote host. 'self' cannot name a path, so the origin is spelled out, when it is one a
# header may carry.
_HOST = re.compile(r"[A-Za-z0-9.\-]+(?::\d{1,5})?|\[[0-9A-Fa-f:.]+\](?::\d{1,5})?")
_HARDENING = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
_JSON_CSP = "default-src 'none'; frame-ancestors 'none'"
_OPEN_ROUTES = frozenset({"/api/bootstrap", "/api/login"})


def error_response(status: int, message: str, code: str, **extra: Any) -> web.Response:
    return web.json_response({"error": {"message": message, "code": code, **extra}}, status=status)


def set_login_cookie(response: web.StreamResponse, cookie: str, request: web.Request) -> None:
    response.set_cookie(
        COOKIE_NAME,
        cookie,
        max_age=COOKIE_MAX_AGE_SECONDS,
        httponly=True,
        samesite="Strict",
        path="/",
        secure=request.secure,
    )


def refusal(auth: Auth, request: web.Request) -> web.Response | None:
    """The answer that refuses ``request`` before its handler runs, or None to let it in."""
    cookie = request.cookies.get(COOKIE_NAME)
    changing = request.method not in ("GET", "HEAD", "OPTIONS")
    origin = request.headers.get("Origin")
    if not auth.auth_required and not is_loopback(host_name(request.host)):
        # Without a password only loopback names may address it: a web page whose name
        # was rebound to 127.0.0.1 would otherwise be "same-origin".
        return error_response(403, "address the web UI as 127.0.0.1 or localhost", "host_refused")
    foreign = origin is not None and origin.rstrip("/").lower() != _own_origin(request)
    if foreign and (changing or request.path.startswith("/api/")):
        return error_response(403, "requests from another web origin are refused", "origin_refused")
    needs_login = request.path.startswith("/api/") and request.path not in _OPEN_ROUTES
    if needs_login and not auth.logged_in(cookie):
        return error_response(401, "log in first", "login_required")
    if changing and not auth.csrf_ok(request.headers.get("X-CSRF-Token"), cookie):
        return error_response(403, "missing or wrong X-CSRF-Token", "csrf_failed")
    return None


def _page_csp(request: web.Request) -> str:
    images = "data:"
    if _HOST.fullmatch(request.host or ""):
        images = f"{request.scheme}://{request.host}/static/ data:"
    return CSP.format(images=images)


def _own_origin(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}".lower()


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the hardening headers and the CSP on every answer."""
    for name, value in _HARDENING.items():
        response.headers.setdefault(name, value)
    content_type = response.headers.get("Content-Type", "")
    response.headers.setdefault(
        "Content-Security-Policy",
        _page_csp(request) if content_type.startswith("text/html") else _JSON_CSP,
    )
    if request.path.startswith("/api/"):
        response.headers.setdefault("Cache-Control", "no-store")
