"""Which sessions the web UI may show: one gate per surface.

The API server's sessions (and through it the chat platforms' approvals) are behind
``API_SERVER_KEY``. A web UI without a password answers any local process on loopback, so
when the API has a key and the web UI has no password, the web UI would be a way past that
key. Then it is *restricted*: it lists, reads and acts on web UI sessions only, refuses the
others (API, Telegram, ...) with a 403 that says how to see them, and its bootstrap carries
``NOTICE`` for the page's banner. With a password (a gate of its own), or without an API key
(no gate to get past), it shows every surface, as before.
"""

from __future__ import annotations

from gateway.config import Platform
from gateway.http.middleware import ApiError

__all__ = ["NOTICE", "SurfaceGate"]

NOTICE = (
    "This web UI shows only its own conversations: the API server has a key and the web UI "
    "has no password. Set REVEILLE_WEBUI_PASSWORD to see API and Telegram conversations here."
)


class SurfaceGate:
    """Whether the web UI is restricted to its own sessions (see the module docstring)."""

    def __init__(self, *, api_key_set: bool, password_set: bool) -> None:
        self.restricted = api_key_set and not password_set

    @property
    def notice(self) -> str | None:
        """The banner's text while restricted."""
        return NOTICE if self.restricted else None

    def shows(self, source: str) -> bool:
        """Whether a session of surface ``source`` (a ``Platform`` value) may be shown."""
        return not self.restricted or source == Platform.WEBUI.value

    def check(self, source: str) -> None:
        """403 for a session the web UI may not show."""
        if not self.shows(source):
            raise self.refusal(f"this is a {source} conversation")

    @staticmethod
    def refusal(what: str) -> ApiError:
        """The 403 for ``what`` ("this is a telegram conversation", ...) while restricted."""
        return ApiError(
            403,
            f"{what}, behind the API key: the web UI shows only its own while it has no "
            "password; set REVEILLE_WEBUI_PASSWORD to see API and Telegram conversations",
            code="webui_password_required",
        )
