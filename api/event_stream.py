"""The one Server-Sent-Events stream of a tab (``GET /api/events``).

Every event goes out as ``id:`` (the event log's id), ``event:`` (its type) and ``data:``
(JSON). A reconnect with ``Last-Event-ID`` (or ``?last_event_id=`` on a first connect) gets
every event after that id replayed from the durable log, then the live ones, each once (the
stream subscribes before it replays and skips ids it already sent); an id the log cannot
replay, or one more than ``MAX_REPLAY`` events behind, gets ``event: reset`` carrying the
newest id, and the tab refetches. A replay is read and written ``REPLAY_PAGE`` events at a
time, so what a tab's replay holds in memory is one page, whatever the log's length.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from api.event_log import EventLog, LoggedEvent, TooManyStreams

__all__ = ["MAX_REPLAY", "PING_SECONDS", "REPLAY_PAGE", "stream_events"]

PING_SECONDS = 15.0
MAX_REPLAY = 5000  # events a reconnecting tab is replayed at most; further behind: reset
REPLAY_PAGE = 200  # events read from the log (and written to the tab) at a time
RETRY_AFTER_SECONDS = 5


async def stream_events(request: web.Request, log: EventLog, owner: str = "") -> web.StreamResponse:
    """Replay after ``Last-Event-ID`` (or ``reset``), then live events until the client
    goes, the server stops, or ``owner`` opens too many streams (its oldest ends); a comment
    line every 15 s keeps proxies from closing it. With every stream of the server open:
    429 with ``Retry-After``."""
    raw_last = request.headers.get("Last-Event-ID") or request.query.get("last_event_id")
    last: int | None = None
    if raw_last:
        try:
            last = int(raw_last)
        except ValueError:
            last = -1  # unreadable: reset
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache, no-store",
            "X-Accel-Buffering": "no",
        }
    )
    try:
        sub = log.subscribe(owner)
    except TooManyStreams:
        return web.json_response(
            {
                "error": {
                    "message": "too many event streams are open; retry shortly",
                    "code": "too_many_streams",
                }
            },
            status=429,
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    try:
        await response.prepare(request)
        sent = last if last is not None and last >= 0 else 0
        if last is not None:
            if not await log.can_replay(last, MAX_REPLAY):
                sent = await log.latest_id()
                await response.write(f"id: {sent}\nevent: reset\ndata: {{}}\n\n".encode())
            else:
                # Up to the newest event now; later ones are in the subscription's queue.
                target = await log.latest_id()
                while sent < target:
                    page = await log.page_after(sent, REPLAY_PAGE)
                    for event in page:
                        await response.write(event.sse())
                        sent = event.id
                    if len(page) < REPLAY_PAGE:
                        break
        else:
            await response.write(b": connected\n\n")
        while True:
            try:
                item: LoggedEvent | None = await asyncio.wait_for(sub.queue.get(), PING_SECONDS)
            except TimeoutError:
                await response.write(b": ping\n\n")
                continue
            if item is None:
                break
            if item.id <= sent:
                continue
            await response.write(item.sse())
            sent = item.id
    except ConnectionError:
        pass
    finally:
        log.unsubscribe(sub)
    with contextlib.suppress(ConnectionError, RuntimeError):
        await response.write_eof()
    return response
