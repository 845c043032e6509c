"""Each HTTP request's id, access log line and record (what a trace is built from).

    request --> X-Request-Id given (1-128 visible ASCII characters)? keep it : make one
                (32 random hex digits; a malformed one is replaced too)
            --> RequestRecord (id, route, times; the route adds the model and its
                engine outputs) --> the app
            <-- response, with ``X-Request-Id``
    afterwards: one access log line carrying the id; with a tracer, the record's spans

SGLang's router (``sglang-router``) forwards a client's ``X-Request-Id`` to the worker
and answers with it, so one id names a request in the router's logs and in radixlm's.
The engine's ids for the request's samples start with a client's id
(``GenerateRequest.request_id``: ``<X-Request-Id>-<random hex>``, unique and unguessable
even when two requests carry the same header), so ``meta_info.id`` and the spans carry it
too; without the header they stay the engine's plain random ids.

The record of the request being served is also in a context variable, so a log line
written deep in a route (``ServerState.log_request``, an error) can name the request
without the request being passed down to it.
"""

from __future__ import annotations

import contextvars
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.requests import Request

from radixlm.runtime.io.messages import GenerateOutput
from radixlm.runtime.io.request_builder import is_request_id

__all__ = [
    "REQUEST_ID_HEADER",
    "TRACED_PATHS",
    "RecordExporter",
    "RequestContextMiddleware",
    "RequestRecord",
    "current_record",
    "current_request_id",
    "note_model",
    "record_of",
]

REQUEST_ID_HEADER = "x-request-id"
# The generation routes: each request to one of them is one trace.
TRACED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/generate", "/v1/responses"})
# W3C trace context: a caller's span (the router's, a client's) becomes the parent.
TRACE_HEADERS = ("traceparent", "tracestate")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

access_logger = logging.getLogger("radixlm.http.access")
logger = logging.getLogger("radixlm.http")
_STATE_KEY = "radixlm_record"
_current: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar(
    "radixlm_request", default=None
)


@dataclass(eq=False)
class RequestRecord:
    """One HTTP request as it went: filled by the middleware (times, status) and by
    the route (``model``, ``outputs``; ``prompt`` and ``completion`` only when
    ``--log-requests`` logged them). Times are ``time.perf_counter()`` seconds, as the
    engine's ``RequestTimes``."""

    request_id: str
    method: str
    path: str
    client: str
    started_at: float
    id_given: bool = False  # the client's X-Request-Id (else the server made one)
    trace_headers: dict[str, str] = field(default_factory=dict)
    body_received_at: float | None = None
    status: int | None = None
    ended_at: float | None = None
    model: str | None = None
    outputs: list[GenerateOutput] = field(default_factory=list)
    prompt: Any = None
    completion: Any = None

    @property
    def engine_request_id(self) -> str | None:
        """What the engine's ids for this request start with (``GenerateRequest.
        request_id``): the client's X-Request-Id; None (plain random ids, as without the
        header) when the server made the id."""
        return self.request_id if self.id_given else None

    def add_output(self, output: GenerateOutput) -> None:
        """A finished output of the request's call (each sample of each prompt)."""
        self.outputs.append(output)


class RecordExporter(Protocol):
    """What the middleware hands each finished record to (``tracing.RequestTracer``)."""

    def export(self, record: RequestRecord) -> None: ...

    def shutdown(self) -> None: ...


def record_of(request: Request) -> RequestRecord | None:
    """The record of ``request`` (None when it did not pass the middleware)."""
    return request.scope.get("state", {}).get(_STATE_KEY)


def note_model(request: Request, model: str | None) -> None:
    """The model a request's body named (its trace's ``gen_ai.request.model``)."""
    record = record_of(request)
    if record is not None:
        record.model = model


def current_request_id() -> str | None:
    """The id of the request being served in this context (None outside one)."""
    record = _current.get()
    return None if record is None else record.request_id


def current_record() -> RequestRecord | None:
    return _current.get()


class RequestContextMiddleware:
    """The outermost middleware: every response (a 401 or 413 of the guard too) carries
    its request's id, and every request gets one access log line with it.

    exporter: gets the record of each request to one of the ``TRACED_PATHS`` once its
    response ended (None: no tracing).
    """

    def __init__(self, app: Any, exporter: RecordExporter | None) -> None:
        self.app = app
        self._exporter = exporter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = self._new_record(scope)
        scope.setdefault("state", {})[_STATE_KEY] = record
        token = _current.set(record)
        id_header = (REQUEST_ID_HEADER.encode(), record.request_id.encode())

        async def noted_receive() -> Message:
            message = await receive()
            body_done = message["type"] == "http.request" and not message.get("more_body")
            if body_done and record.body_received_at is None:
                record.body_received_at = time.perf_counter()
            return message

        async def noted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), id_header]}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                record.ended_at = time.perf_counter()
            await send(message)

        try:
            await self.app(scope, noted_receive, noted_send)
        finally:
            _current.reset(token)
            if record.ended_at is None:  # the client left, or the app raised
                record.ended_at = time.perf_counter()
            self._finish(record)

    def _new_record(self, scope: Scope) -> RequestRecord:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        given = headers.get(REQUEST_ID_HEADER)
        client = scope.get("client")
        record = RequestRecord(
            request_id=given if is_request_id(given) else uuid.uuid4().hex,
            method=scope["method"],
            path=scope["path"],
            client=f"{client[0]}:{client[1]}" if client else "-",
            started_at=time.perf_counter(),
            id_given=is_request_id(given),
        )
        if self._exporter is not None:
            record.trace_headers = {h: headers[h] for h in TRACE_HEADERS if h in headers}
        return record

    def _finish(self, record: RequestRecord) -> None:
        assert record.ended_at is not None
        access_logger.info(
            '%s "%s %s" %s %.1f ms request_id=%s',
            record.client,
            record.method,
            record.path,
            record.status if record.status is not None else "-",
            (record.ended_at - record.started_at) * 1e3,
            record.request_id,
        )
        if self._exporter is None or record.path not in TRACED_PATHS:
            return
        try:
            self._exporter.export(record)
        except Exception:  # a trace must never fail the request
            logger.exception("trace export failed request_id=%s", record.request_id)
