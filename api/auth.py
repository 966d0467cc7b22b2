"""Web UI login and CSRF: a signed session cookie, constant-time checks, a login rate limit.

Without a password (loopback only) nobody logs in and ``auth_required`` is false. With one,
``POST /api/login`` compares it in constant time, is limited to ``max_failures`` wrong
passwords per client per ``window_seconds`` (then 429), and sets ``reveille_webui``: an
issue time and a nonce, signed with HMAC-SHA256 under the state directory's secret,
``HttpOnly; SameSite=Strict``. A CSRF token is an HMAC of the cookie's nonce (or of
"anonymous" without login): a state-changing request must send it as ``X-CSRF-Token``, which
no other web page can read or set.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

__all__ = ["COOKIE_NAME", "Auth"]

COOKIE_NAME = "reveille_webui"
COOKIE_MAX_AGE_SECONDS = 30 * 24 * 3600


class Auth:
    """Password check, cookie signing, CSRF tokens and the login rate limit."""

    def __init__(
        self,
        password: str,
        secret: bytes,
        *,
        max_failures: int = 5,
        window_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._password = hashlib.sha256(password.encode()).digest() if password else None
        self._secret = secret
        self.max_failures = max_failures
        self.window_seconds = window_seconds
        self._clock = clock
        self._failures: dict[str, list[float]] = {}

    @property
    def auth_required(self) -> bool:
        return self._password is not None

    def _sign(self, text: str) -> str:
        return hmac.new(self._secret, text.encode(), hashlib.sha256).hexdigest()

    # ----------------------------------------------------------------- the cookie

    def new_cookie(self) -> str:
        body = f"{int(time.time())}.{secrets.token_hex(16)}"
        return f"{body}.{self._sign(body)}"

    def _nonce(self, cookie: str | None) -> str | None:
        """The nonce of a valid, unexpired cookie, else None."""
        if not cookie or cookie.count(".") != 2:
            return None
        issued, nonce, signature = cookie.split(".")
        if not hmac.compare_digest(self._sign(f"{issued}.{nonce}"), signature):
            return None
        try:
            age = time.time() - int(issued)
        except ValueError:
            return None
        return nonce if 0 <= age <= COOKIE_MAX_AGE_SECONDS else None

    def logged_in(self, cookie: str | None) -> bool:
        return not self.auth_required or self._nonce(cookie) is not None

    # ----------------------------------------------------------------- CSRF

    def csrf_token(self, cookie: str | None) -> str:
        nonce = self._nonce(cookie) if self.auth_required else None
        return self._sign(f"csrf:{nonce or 'anonymous'}")

    def csrf_ok(self, header: str | None, cookie: str | None) -> bool:
        return bool(header) and hmac.compare_digest(str(header), self.csrf_token(cookie))

    # ----------------------------------------------------------------- login

    def rate_limited(self, client: str) -> bool:
        now = self._clock()
        recent = [t for t in self._failures.get(client, []) if now - t < self.window_seconds]
        if recent:
            self._failures[client] = recent
        else:
            self._failures.pop(client, None)
        return len(recent) >= self.max_failures

    def check_password(self, client: str, given: object) -> bool:
        """Constant-time comparison; a wrong password counts against ``client``."""
        if self._password is None:
            return True
        candidate = hashlib.sha256(str(given).encode("utf-8", "replace")).digest()
        if hmac.compare_digest(candidate, self._password) and isinstance(given, str):
            self._failures.pop(client, None)
            return True
        self._failures.setdefault(client, []).append(self._clock())
        return False
