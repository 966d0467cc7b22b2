"""The approvals routes of the API server: what API clients decide about their turns' commands.

``GET /api/approvals`` lists the approvals pending in API-server sessions: a turn's (the
turn answered its client with a note naming it) and a background unit's (a sub-agent's
command, asked after its turn ended: ``unit_id`` names the unit, ``expires_at`` its
deadline; the ``reveille.approval.requested`` webhook announces it). ``POST
/api/approvals/{id}`` with ``{"approve": true}`` or ``{"approve": false}`` decides one,
once: 404 for an id that is unknown or belongs to another surface's session (the web UI's,
a Telegram chat's: their own people decide those), 409 ``approval_already_decided`` for a
second decision and 409 ``approval_expired`` for one nobody may answer any more (its turn
is gone: settled as denied; a unit's deadline passed or its unit is gone: settled expired).
Both need the API key: without one configured they answer 401, since anyone on the
machine could otherwise approve commands.

A question that asks a form (an MCP server's elicitation) lists its JSON schema as
``form``; ``{"approve": true, "values": {...}}`` answers it (checked against the form: 400
``invalid_answer`` with nothing decided when it does not fit; a yes without values takes
the form's defaults), and the decided approval shows the ``answer``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.approvals import (
    AlreadyDecided,
    ApprovalRecord,
    Approvals,
    Expired,
    FormError,
    pending_approvals,
)
from gateway.config import Platform
from gateway.delivery_targets import session_platform
from gateway.http.middleware import SESSION_HEADER, ApiError
from gateway.session import SessionStore

__all__ = ["ApprovalRoutes"]

_MAX_ID = 64


class ApprovalRoutes:
    """The handlers, over ``approvals`` (the store they read and decide in)."""

    def __init__(
        self,
        approvals: Approvals,
        *,
        read_json: Callable[[web.Request], Awaitable[Any]],
        keyed: Callable[[web.Request], bool],
    ) -> None:
        self.approvals = approvals
        self.store: SessionStore = approvals.store
        self._read_json = read_json
        self._keyed = keyed

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/api/approvals", self.list_pending)
        router.add_post("/api/approvals/{approval_id}", self.decide)

    def _require_key(self, request: web.Request) -> None:
        if not self._keyed(request):
            raise ApiError(
                401,
                "deciding approvals needs the API key: set API_SERVER_KEY on the server and "
                "send it as a Bearer token (or use `reveille approvals` on the server)",
                code="invalid_api_key",
            )

    def _ours(self, record: ApprovalRecord) -> bool:
        session = self.store.get_session(record.session_id)
        return session is not None and session_platform(session) is Platform.API_SERVER

    async def list_pending(self, request: web.Request) -> web.Response:
        self._require_key(request)

        def read() -> list[ApprovalRecord]:
            return [r for r in self._pending() if self._ours(r)]

        records = await asyncio.to_thread(read)
        return web.json_response({"object": "list", "data": [_view(r) for r in records]})

    def _pending(self) -> list[ApprovalRecord]:
        return pending_approvals(self.store)

    async def decide(self, request: web.Request) -> web.Response:
        self._require_key(request)
        approval_id = request.match_info["approval_id"]
        body = await self._read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("approve"), bool):
            raise ApiError(
                400,
                'send {"approve": true} or {"approve": false}',
                param="approve",
                code="invalid_decision",
            )
        values = body.get("values")
        if values is not None and not isinstance(values, dict):
            raise ApiError(
                400,
                '"values" must be an object of the form\'s field values',
                param="values",
                code="invalid_decision",
            )
        if len(approval_id) > _MAX_ID:
            raise _unknown(approval_id[:_MAX_ID])
        record = await asyncio.to_thread(self.store.get_approval, approval_id)
        if record is None or not await asyncio.to_thread(self._ours, record):
            raise _unknown(approval_id)
        try:
            decided = await self.approvals.decide(
                approval_id, body["approve"], by="the API", values=values
            )
        except KeyError:
            raise _unknown(approval_id) from None
        except FormError as exc:
            raise ApiError(
                400, f"approval {approval_id}: {exc}", param="values", code="invalid_answer"
            ) from None
        except Expired as exc:
            why = (
                "nobody answered before its deadline, or the background task that asked it "
                "is gone; it was settled as expired and nothing ran"
                if exc.record.background
                else "the turn that asked it ended (the server restarted or the turn "
                "stopped); it was settled as denied. Ask again."
            )
            raise ApiError(
                409, f"approval {approval_id} expired: {why}", code="approval_expired"
            ) from exc
        except AlreadyDecided:
            settled = await asyncio.to_thread(self.store.get_approval, approval_id)
            if settled is not None and settled.status == "expired":
                raise ApiError(
                    409,
                    f"approval {approval_id} expired: nobody answered before its deadline, or "
                    "the background task that asked it stopped; nothing ran",
                    code="approval_expired",
                ) from None
            raise ApiError(
                409, f"approval {approval_id} was already decided", code="approval_already_decided"
            ) from None
        return web.json_response(
            {"approval": _view(decided)}, headers={SESSION_HEADER: decided.session_id}
        )


def _unknown(approval_id: str) -> ApiError:
    return ApiError(
        404, f"no approval {approval_id!r} in this server's sessions", code="approval_not_found"
    )


def _view(record: ApprovalRecord) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": record.id,
        "object": "approval",
        "session_id": record.session_id,
        "command": record.command,
        "status": record.status,
        "created": int(record.created_at),
        "unit_id": record.unit_id or None,
    }
    if record.background:
        view["expires_at"] = int(record.expires_at)
    if record.form:
        view["form"] = json.loads(record.form)
    if record.answer:
        view["answer"] = json.loads(record.answer)
    return view
