"""The ``/v1/conversations`` routes of the API server (``gateway.conversations`` does the work).

``POST /v1/conversations`` (``metadata``, ``items``), ``GET|POST|DELETE
/v1/conversations/{id}``, ``GET|POST /v1/conversations/{id}/items`` (``after``,
``limit``, ``order``), ``GET|DELETE /v1/conversations/{id}/items/{item_id}``.

The port's key check and body rules apply as for every route. On a keyless server a
conversation belongs to the bearer token that created it (its owner key, as a
response's does): for anyone else, and for an unknown, malformed or deleted id, it does
not exist (404). ``session_of`` is how ``conversation`` on ``POST /v1/responses`` (and
``input_tokens``, ``compact``) finds the session a request may run in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from agent.messages import ChatMessage
from gateway.conversations import Conversations
from gateway.http.middleware import ApiError
from gateway.openai.responses_wire import conversation_of, input_items, metadata_of
from gateway.session import SessionGone, SessionRecord
from gateway.surfaces.api_server.auth import owner_of, visible_to
from gateway.surfaces.api_server.paging import page_of

__all__ = ["ConversationRoutes"]

MAX_ITEMS_ADDED = 20  # items one create or items call adds, as OpenAI caps it

ReadJson = Callable[[web.Request], Awaitable[Any]]


def _not_found(conversation_id: object) -> ApiError:
    return ApiError(
        404,
        f"No conversation found with id {conversation_id!r}",
        code="conversation_not_found",
        param="conversation",
    )


def _object_body(body: object) -> dict[str, object]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return body


def _messages(raw: object) -> list[ChatMessage]:
    if raw is None:
        return []
    pairs = input_items(raw, "items")
    if len(pairs) > MAX_ITEMS_ADDED:
        raise ApiError(
            400, f"at most {MAX_ITEMS_ADDED} items at a time", param="items", code="invalid_value"
        )
    return [message for _, message in pairs]


class ConversationRoutes:
    """The handlers over a ``Conversations`` (see the module docstring)."""

    def __init__(self, conversations: Conversations, *, read_json: ReadJson) -> None:
        self.conversations = conversations
        self._read_json = read_json

    def add_to(self, router: web.UrlDispatcher) -> None:
        base = "/v1/conversations/{conversation_id}"
        router.add_post("/v1/conversations", self._create)
        router.add_get(base, self._retrieve)
        router.add_post(base, self._update)
        router.add_delete(base, self._delete)
        router.add_get(base + "/items", self._list_items)
        router.add_post(base + "/items", self._add_items)
        router.add_get(base + "/items/{item_id}", self._get_item)
        router.add_delete(base + "/items/{item_id}", self._delete_item)

    async def session_of(self, request: web.Request, conversation: object) -> str:
        """The session of a ``conversation`` parameter the request may use, else 404."""
        conversation_id = conversation_of(conversation)
        return (await self._visible(request, conversation_id)).id

    async def _visible(self, request: web.Request, conversation_id: str | None) -> SessionRecord:
        record = (
            await self.conversations.get(conversation_id) if conversation_id is not None else None
        )
        if record is None or not visible_to(request, record.source):
            raise _not_found(conversation_id)
        return record

    async def _path(self, request: web.Request) -> SessionRecord:
        return await self._visible(request, request.match_info["conversation_id"])

    # ----------------------------------------------------------------- conversations

    async def _create(self, request: web.Request) -> web.Response:
        body = _object_body(await self._read_json(request))
        metadata = metadata_of(body.get("metadata"))
        messages = _messages(body.get("items"))
        record = await self.conversations.create(owner_of(request), metadata, messages)
        return web.json_response(self.conversations.object_of(record))

    async def _retrieve(self, request: web.Request) -> web.Response:
        return web.json_response(self.conversations.object_of(await self._path(request)))

    async def _update(self, request: web.Request) -> web.Response:
        record = await self._path(request)
        body = _object_body(await self._read_json(request))
        if "metadata" not in body:
            raise ApiError(
                400, "'metadata' is required", param="metadata", code="missing_required_parameter"
            )
        updated = await self.conversations.set_metadata(record.id, metadata_of(body["metadata"]))
        if updated is None:
            raise _not_found(record.id)
        return web.json_response(self.conversations.object_of(updated))

    async def _delete(self, request: web.Request) -> web.Response:
        record = await self._path(request)
        if not await self.conversations.delete(record.id):
            raise _not_found(record.id)
        return web.json_response(
            {"id": record.id, "object": "conversation.deleted", "deleted": True}
        )

    # ----------------------------------------------------------------- items

    async def _list_items(self, request: web.Request) -> web.Response:
        record = await self._path(request)
        try:
            items = await self.conversations.items(record.id)
        except SessionGone:
            raise _not_found(record.id) from None
        return web.json_response(page_of(items, request.query, what="item"))

    async def _add_items(self, request: web.Request) -> web.Response:
        record = await self._path(request)
        body = _object_body(await self._read_json(request))
        messages = _messages(body.get("items"))
        if not messages:
            raise ApiError(
                400,
                "'items' is required: an array of 1 to 20 items",
                param="items",
                code="missing_required_parameter",
            )
        try:
            added = await self.conversations.append(record.id, messages)
        except SessionGone:
            raise _not_found(record.id) from None
        return web.json_response(
            {
                "object": "list",
                "data": added,
                "first_id": added[0]["id"],
                "last_id": added[-1]["id"],
                "has_more": False,
            }
        )

    def _no_item(self, item_id: str) -> ApiError:
        return ApiError(
            404, f"No item found with id {item_id!r}", code="item_not_found", param="item_id"
        )

    async def _get_item(self, request: web.Request) -> web.Response:
        record = await self._path(request)
        item_id = request.match_info["item_id"]
        item = await self.conversations.item(record.id, item_id)
        if item is None:
            raise self._no_item(item_id)
        return web.json_response(item)

    async def _delete_item(self, request: web.Request) -> web.Response:
        record = await self._path(request)
        item_id = request.match_info["item_id"]
        if not await self.conversations.remove_item(record.id, item_id):
            raise self._no_item(item_id)
        return web.json_response(self.conversations.object_of(record))
