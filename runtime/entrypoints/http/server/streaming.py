"""Responses that stop the engine's work when their client goes away.

    EventStreamResponse: sends an async iterator of SSE events; when the client
        disconnects (an ``http.disconnect`` message, or a failed send) it stops
        and closes the iterator at once, which aborts the requests behind it and
        frees their KV.
    until_disconnected: awaits a non-streamed generation, polling the connection;
        a client that left cancels it (the engine's drain then aborts its requests).

Closing is explicit (``aclose`` in a ``finally``), never left to the garbage
collector: an abandoned iterator would otherwise hold its KV until collected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from radixlm.runtime.entrypoints.http.server.request_context import current_request_id

__all__ = [
    "DISCONNECT_POLL_S",
    "ClientGone",
    "EventStreamResponse",
    "client_gone_response",
    "until_disconnected",
]

DISCONNECT_POLL_S = 0.25  # how often a non-streamed request checks its connection
T = TypeVar("T")
logger = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client closed its connection before its response was ready."""


class EventStreamResponse(StreamingResponse):
    """``text/event-stream`` from ``events``; ``on_close`` runs once when it ends, however."""

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        sender = asyncio.ensure_future(self._send_all(send))
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait({sender, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sender, watcher):
                task.cancel()
            results = await asyncio.gather(sender, watcher, return_exceptions=True)
            if isinstance(results[0], Exception):  # the events' own errors are events
                logger.error(
                    "event stream failed request_id=%s", current_request_id(), exc_info=results[0]
                )
            with contextlib.suppress(Exception):
                await self._events.aclose()  # type: ignore[attr-defined]
            self._on_close()

    async def _send_all(self, send: Any) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
        with contextlib.suppress(OSError):  # the client is gone: the watcher ends us
            await send(start)
            async for event in self._events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _wait_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``await work``, cancelled (raising ClientGone) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def client_gone_response() -> Response:
    """What a handler returns for a client that left: nobody reads it (nginx's 499)."""
    return Response(status_code=499)
