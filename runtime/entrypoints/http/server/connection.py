"""Connections that cannot be held open for nothing: uvicorn's h11 protocol with a
deadline on each request's headers, and a shutdown that answers a request whose body
is still arriving instead of waiting on it.

    connection made, or its last response sent
      --header_read_timeout_s--> headers of the next request complete?
          no: closed (with a 408 when part of a request had arrived)
    the body: ``GuardMiddleware``'s deadline (``body_read_timeout_s``) -> 408
    shutdown: idle or reading headers: closed (uvicorn's own); reading a body: 503, closed

uvicorn itself has only a keep-alive timeout, which a client disarms by sending a
single byte. This subclass relies on ``H11Protocol``'s attributes (``conn``,
``cycle``, ``transport``); ``tests/runtime/entrypoints/http/test_connection.py``
pins that down.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import orjson
from uvicorn.protocols.http.h11_impl import H11Protocol

from radixlm.runtime.entrypoints.http.server.errors import REQUEST_TIMEOUT, STOPPED, APIError

__all__ = ["TimedH11Protocol"]


class TimedH11Protocol(H11Protocol):
    """``header_timeout_s``: how long a request's headers may take to arrive."""

    def __init__(self, *args: Any, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a request's headers are in
            self._disarm_header_timer()

    def on_response_complete(self) -> None:
        self._arm_header_timer()  # for the next request (disarmed again if it is pipelined)
        super().on_response_complete()

    def shutdown(self) -> None:
        cycle = self.cycle
        conn = self.conn
        receiving = conn.their_state is h11.SEND_BODY and conn.our_state is h11.SEND_RESPONSE
        if cycle is None or cycle.response_started or not receiving:
            super().shutdown()
            return
        # Its body is still arriving (maybe at a byte a second): answer now, not after it.
        self._disarm_header_timer()
        self._write_error(APIError(STOPPED, "the server is shutting down: retry elsewhere"))
        cycle.disconnected = True  # the route's receive() now returns http.disconnect
        cycle.message_event.set()
        self.transport.close()

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self._header_timeout_s, self._headers_late)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # part of a request came: say why it is closed
            message = f"the request's headers did not arrive within {self._header_timeout_s:g} s"
            self._write_error(APIError(REQUEST_TIMEOUT, message))
        self.transport.close()

    def _write_error(self, error: APIError) -> None:
        """An OpenAI-shaped error response, written straight to the socket (the
        connection is closed after it)."""
        body = orjson.dumps(error.body())
        head = [
            f"HTTP/1.1 {error.status} {_REASONS.get(error.status, 'Error')}",
            "content-type: application/json",
            f"content-length: {len(body)}",
            "connection: close",
            *(f"{k}: {v}" for k, v in error.headers.items()),
        ]
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)


_REASONS = {408: "Request Timeout", 503: "Service Unavailable"}
