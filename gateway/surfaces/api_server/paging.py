"""One page of an OpenAI list endpoint (``after``, ``limit``, ``order``) over items with ids.

Shared by a response's ``input_items`` and a conversation's ``items``: the query checked
(400 in OpenAI's error shape), the page cut, and the ``list`` object around it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, TypedDict, TypeVar

from gateway.http.middleware import ApiError

__all__ = ["MAX_PAGE", "ListPage", "page_of"]

MAX_PAGE = 100


Item = TypeVar("Item", bound=Mapping[str, object])


class ListPage(TypedDict):
    object: Literal["list"]
    data: list[object]
    first_id: str | None
    last_id: str | None
    has_more: bool


def page_of(items: Sequence[Item], query: Mapping[str, str], *, what: str) -> ListPage:
    """The page of ``items`` (oldest first) the query asks for (newest first by default)."""
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_PAGE:
        raise ApiError(400, f"'limit' must be an integer from 1 to {MAX_PAGE}", param="limit")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, "'order' must be asc or desc", param="order")
    ordered = list(reversed(items)) if order == "desc" else list(items)
    after = query.get("after")
    if after is not None:
        ids = [str(item["id"]) for item in ordered]
        if after not in ids:
            raise ApiError(400, f"no {what} {after!r} here", param="after")
        ordered = ordered[ids.index(after) + 1 :]
    page = ordered[:limit]
    return {
        "object": "list",
        "data": list(page),
        "first_id": str(page[0]["id"]) if page else None,
        "last_id": str(page[-1]["id"]) if page else None,
        "has_more": len(ordered) > limit,
    }
