"""Web UI login and CSRF: a signed session cookie, constant-time checks, a login rate limit.

Without a password (loopback only) nobody logs in and ``auth_required`` is false. With one,
``POST /api/login`` compares it in constant time, is limited to ``max_failures`` attempts
per client per ``window_seconds`` (then 429), and sets ``reveille_webui``: an
issue time, the login epoch and a nonce, signed with HMAC-SHA256, ``HttpOnly;
SameSite=Strict``, for ``COOKIE_MAX_AGE_SECONDS`` (renewed when the page loads).

The limit never locks the right password out. A browser that logged in once carries a
signed known-browser cookie (``reveille_browser``, bound to the password like the login):
its attempts are counted under that cookie, not its address, so an attacker on the same
address (or behind the same reverse proxy) who spends the address's budget does not touch
it. Other attempts are counted per address (``limit_key``): the peer's, or behind a proxy
listed in ``[webui] trusted_proxies`` the client ``X-Forwarded-For`` names
(``client_address``), never a header an untrusted peer sent.

A login ends when it should: the signing key is derived from the state directory's secret
AND the password, so changing the password ends every login; ``POST /api/logout`` moves the
login epoch on (kept in the state directory), which ends every login made before it.

A CSRF token is an HMAC of the cookie's nonce (or of "anonymous" without login): a
state-changing request must send it as ``X-CSRF-Token``, which no other web page can read
or set.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

__all__ = [
    "COOKIE_FUTURE_TOLERANCE_SECONDS",
    "COOKIE_MAX_AGE_SECONDS",
    "COOKIE_NAME",
    "COOKIE_RENEW_AFTER_SECONDS",
    "DEVICE_COOKIE_MAX_AGE_SECONDS",
    "DEVICE_COOKIE_NAME",
    "Auth",
    "client_address",
]

COOKIE_NAME = "reveille_webui"
COOKIE_MAX_AGE_SECONDS = 7 * 24 * 3600
# A login in use is renewed (a fresh cookie) once it is this old, so it lapses only when idle.
COOKIE_RENEW_AFTER_SECONDS = 24 * 3600
# A cookie "from the future" is one this server signed before its wall clock was stepped
# back (NTP, a resumed VM): it is no forgery (it carries our signature), so it stays a login
# for up to one cookie life ahead, and is renewed at once, into the clock's new time base.
# Further ahead is beyond reason (a clock reset by years): not a login.
COOKIE_FUTURE_TOLERANCE_SECONDS = COOKIE_MAX_AGE_SECONDS
_FUTURE_RENEW_SECONDS = 60  # issue times rounded down, small skews: no renewal for those
DEVICE_COOKIE_NAME = "reveille_browser"
DEVICE_COOKIE_MAX_AGE_SECONDS = 365 * 24 * 3600
_MAX_LIMITED_CLIENTS = 10_000  # clients whose attempts are remembered at once


def client_address(
    peer: str | None, forwarded_for: list[str], trusted_proxies: frozenset[str]
) -> str:
    """Whose login attempt this is: the peer's address, or, when the peer is a trusted
    proxy, the rightmost ``X-Forwarded-For`` entry that is not a trusted proxy (entries to
    its left are whatever the client wrote, so never believed)."""
    address = peer or "?"
    if address not in trusted_proxies:
        return address
    hops = [h.strip() for value in forwarded_for for h in value.split(",") if h.strip()]
    for hop in reversed(hops):
        if hop not in trusted_proxies:
            return hop
    return address


class Auth:
    """Password check, cookie signing, CSRF tokens and the login rate limit."""

    def __init__(
        self,
        password: str,
        secret: bytes,
        *,
        epoch: int = 0,
        max_failures: int = 5,
        window_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        """``clock`` times the login rate limit; ``wall_clock`` (default ``time.time``,
        read at each call) stamps and ages cookies, which outlive the process."""
        self._password = hashlib.sha256(password.encode()).digest() if password else None
        # Bound to the password: a new password makes every cookie signed before it invalid.
        self._secret = hmac.new(
            secret, b"login:" + (self._password or b""), hashlib.sha256
        ).digest()
        self.epoch = epoch
        self.max_failures = max_failures
        self.window_seconds = window_seconds
        self._clock = clock
        self._wall_clock = wall_clock
        self._failures: dict[str, list[float]] = {}

    @property
    def auth_required(self) -> bool:
        return self._password is not None

    def _sign(self, text: str) -> str:
        return hmac.new(self._secret, text.encode(), hashlib.sha256).hexdigest()

    # ----------------------------------------------------------------- the cookie

    def _wall(self) -> float:
        return self._wall_clock() if self._wall_clock is not None else time.time()

    def new_cookie(self) -> str:
        body = f"{int(self._wall())}.{self.epoch}.{secrets.token_hex(16)}"
        return f"{body}.{self._sign(body)}"

    def _parts(self, cookie: str | None) -> tuple[float, str] | None:
        """The age and the nonce of a valid, unexpired cookie of this epoch, else None."""
        if not cookie or cookie.count(".") != 3:
            return None
        issued, epoch, nonce, signature = cookie.split(".")
        if not hmac.compare_digest(self._sign(f"{issued}.{epoch}.{nonce}"), signature):
            return None
        if epoch != str(self.epoch):
            return None  # logged out since (every login before the logout ended)
        try:
            age = self._wall() - int(issued)
        except ValueError:
            return None
        # A negative age is a wall clock stepped back since: still a login (see above).
        valid = -COOKIE_FUTURE_TOLERANCE_SECONDS <= age <= COOKIE_MAX_AGE_SECONDS
        return (age, nonce) if valid else None

    def _nonce(self, cookie: str | None) -> str | None:
        parts = self._parts(cookie)
        return parts[1] if parts is not None else None

    def needs_renewal(self, cookie: str | None) -> bool:
        """A valid login old enough to be handed a fresh cookie, or one from the future
        (the clock was stepped back): its fresh cookie counts its life from now."""
        parts = self._parts(cookie) if self.auth_required else None
        if parts is None:
            return False
        return parts[0] >= COOKIE_RENEW_AFTER_SECONDS or parts[0] < -_FUTURE_RENEW_SECONDS

    def login_id(self, cookie: str | None) -> str | None:
        """Which login a cookie is (its nonce), or None when it is none."""
        return self._nonce(cookie) if self.auth_required else None

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

    def start_attempt(self, client: str) -> bool:
        """Count a login attempt of ``client`` as it starts, before its body is read; False
        (refuse it) once the window's attempts are spent. Counting only the wrong answers
        let a client start many attempts at once, headers first and bodies later, and have
        every one of them checked."""
        if self.rate_limited(client):
            return False
        if len(self._failures) >= _MAX_LIMITED_CLIENTS:
            self._forget_idle()
        self._failures.setdefault(client, []).append(self._clock())
        return True

    def _forget_idle(self) -> None:
        """Drop the clients with no attempt in the window (bounds the memory of many)."""
        now = self._clock()
        for client in [c for c, t in self._failures.items() if now - t[-1] >= self.window_seconds]:
            del self._failures[client]

    # ----------------------------------------------------------------- known browsers

    def new_device_cookie(self) -> str:
        """The known-browser cookie a successful login hands out (see the module docstring)."""
        body = f"device.{secrets.token_hex(16)}"
        return f"{body}.{self._sign(body)}"

    def limit_key(self, address: str, device_cookie: str | None) -> str:
        """What an attempt is counted under: a valid known-browser cookie, else the address."""
        if device_cookie and device_cookie.count(".") == 2:
            kind, nonce, signature = device_cookie.split(".")
            if kind == "device" and hmac.compare_digest(self._sign(f"device.{nonce}"), signature):
                return f"browser:{nonce}"
        return f"addr:{address}"

    def check_password(self, client: str, given: object) -> bool:
        """Constant-time comparison. The attempt was counted when it started
        (``start_attempt``); the right password forgives the client's attempts."""
        if self._password is None:
            return True
        candidate = hashlib.sha256(str(given).encode("utf-8", "replace")).digest()
        if hmac.compare_digest(candidate, self._password) and isinstance(given, str):
            self._failures.pop(client, None)
            return True
        return False
