"""A small Telegram Bot API client over aiohttp: ``{base}/bot{token}/{method}``, JSON in and out.

Every answer of the Bot API is ``{"ok": true, "result": ...}`` or ``{"ok": false,
"error_code": ..., "description": ..., "parameters": {"retry_after": ...}}``. ``call`` returns
the result or raises ``TelegramError``, which classifies the failure the way the delivery
ledger needs it (see ``TelegramError``). Connection failures and unreadable answers are
``TelegramError`` too (``error_code`` None, transient), so callers handle one exception type.

The token is part of every URL: it is never logged (``TelegramError`` messages name the
method only).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from agent.messages import JSONObject
from gateway.session import SessionSource
from gateway.surfaces.telegram.updates import TooDeep, loads_bounded

__all__ = ["DEFAULT_BASE_URL", "TelegramApi", "TelegramError", "thread_params"]

logger = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.telegram.org"


class TelegramError(Exception):
    """A Bot API call that failed.

    * ``retry_after``: a 429's ``parameters.retry_after`` (seconds), else None;
    * ``transient``: a later retry may succeed (429, 5xx, connection failures);
    * ``gone``: the chat is gone for good for this bot (blocked, kicked, deactivated,
      chat not found): a delivery to it is dropped, never retried;
    * ``not_modified``: an edit that would change nothing ("message is not modified"),
      which callers count as success.
    """

    def __init__(
        self,
        method: str,
        error_code: int | None,
        description: str,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(
            f"Telegram {method} failed"
            + (f" with {error_code}" if error_code is not None else "")
            + f": {description}"
        )
        self.method = method
        self.error_code = error_code
        self.description = description
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        return self.error_code is None or self.error_code == 429 or self.error_code >= 500

    @property
    def gone(self) -> bool:
        text = self.description.lower()
        if self.error_code == 403:
            # "bot was blocked by the user", "bot was kicked from the group chat",
            # "user is deactivated", "bot can't initiate conversation with a user"
            return True
        return self.error_code == 400 and "chat not found" in text

    @property
    def not_modified(self) -> bool:
        return self.error_code == 400 and "message is not modified" in self.description.lower()


class TelegramApi:
    """Bot API calls for one bot token. ``close()`` when done."""

    def __init__(
        self,
        token: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        request_timeout: float = 30.0,
    ) -> None:
        if not token:
            raise ValueError("a Telegram bot token is required")
        self._token = token
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self.request_timeout = request_timeout
        self._http: aiohttp.ClientSession | None = None

    @property
    def bot_id(self) -> str:
        """The bot's numeric id, the part of the token before ':' (no request needed)."""
        return self._token.partition(":")[0] or "bot"

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            # trust_env stays False: a proxy from the environment must not see the token.
            self._http = aiohttp.ClientSession()
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def call(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        http_timeout: float | None = None,
    ) -> Any:
        """POST ``params`` as JSON to ``method``; the result, or ``TelegramError``.

        ``http_timeout`` bounds the request (a long poll's must outlast its ``timeout``).
        Parameters that are None are left out.
        """
        url = f"{self.base_url}/bot{self._token}/{method}"
        body = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            async with self._session().post(
                url,
                json=body,
                timeout=aiohttp.ClientTimeout(total=http_timeout or self.request_timeout),
                allow_redirects=False,
            ) as resp:
                status = resp.status
                raw = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Some client errors quote the URL, which holds the token.
            detail = f"{type(exc).__name__}: {exc}".rstrip(": ").replace(self._token, "<token>")
            raise TelegramError(method, None, detail) from None
        try:
            data = loads_bounded(raw) if raw else None
        except TooDeep:
            raise TelegramError(method, 502, "the answer is JSON nested too deeply") from None
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise TelegramError(
                method, status if status >= 400 else 502, f"HTTP {status} without a Bot API answer"
            )
        if data.get("ok") is True:
            return data.get("result")
        given = data.get("error_code")
        code: int = (
            given
            if isinstance(given, int) and not isinstance(given, bool)
            else (status if status >= 400 else 500)
        )
        parameters = data.get("parameters")
        retry_after: float | None = None
        if isinstance(parameters, dict):
            value = parameters.get("retry_after")
            if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
                retry_after = float(value)
        description = str(data.get("description") or f"HTTP {status}")
        raise TelegramError(method, code, description, retry_after=retry_after)


def thread_params(source: SessionSource) -> JSONObject:
    """The Bot API parameter that keeps a message in its forum topic, if the chat has one."""
    return {"message_thread_id": int(source.thread_id)} if source.thread_id else {}
