"""The FastAPI application: the routes, the guard, and one error shape for all.

    RequestContextMiddleware (X-Request-Id, access log, trace)
      --> GuardMiddleware (API key, body size) --> routes (openai/, responses/,
                                                   native/)
    any error --> {"error": {"message", "type", "param", "code"}} with its 4xx/5xx

The app never owns the engine: ``build_app`` takes a ``ServerState`` around one.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from radixlm.runtime.entrypoints.http.native import routes as native_routes
from radixlm.runtime.entrypoints.http.openai import routes as openai_routes
from radixlm.runtime.entrypoints.http.responses import routes as responses_routes
from radixlm.runtime.entrypoints.http.responses.store import ResponseStore
from radixlm.runtime.entrypoints.http.server.errors import (
    INTERNAL,
    INVALID,
    NOT_FOUND,
    APIError,
    ErrorKind,
    api_error_from,
    validation_error,
)
from radixlm.runtime.entrypoints.http.server.guard import GuardMiddleware
from radixlm.runtime.entrypoints.http.server.request_context import (
    RequestContextMiddleware,
    current_request_id,
)
from radixlm.runtime.entrypoints.http.server.state import ServerState

__all__ = ["build_app"]

logger = logging.getLogger("radixlm.http")


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="radixlm", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    # the Responses API's stored responses: this app's own, as the routes are
    app.state.responses = ResponseStore(
        state.config.max_stored_responses, state.config.max_stored_response_bytes
    )
    app.include_router(openai_routes.router)
    app.include_router(responses_routes.router)
    app.include_router(native_routes.router)
    app.add_middleware(
        GuardMiddleware,
        api_keys=state.config.api_keys,
        max_body_bytes=state.config.max_request_body_bytes,
        body_timeout_s=state.config.body_read_timeout_s,
    )
    app.add_middleware(RequestContextMiddleware, exporter=state.tracer)  # the outermost
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(ValueError, _value_error)
    app.add_exception_handler(Exception, _internal_error)
    return app


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(validation_error(list(exc.errors())))


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own: no such route (404), wrong method (405)."""
    assert isinstance(exc, StarletteHTTPException)
    kind = NOT_FOUND if exc.status_code == 404 else ErrorKind(exc.status_code, INVALID.type)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return error_response(
        APIError(kind, message, code="not_found" if exc.status_code == 404 else None)
    )


async def _client_gone(request: Request, exc: Exception) -> Response:
    """The client left (or shutdown cut it off) while its body was being read: nobody
    reads this answer (nginx's 499)."""
    return Response(status_code=499)


async def _value_error(request: Request, exc: Exception) -> JSONResponse:
    return error_response(api_error_from(exc))


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception(
        "unhandled error on %s %s request_id=%s",
        request.method,
        request.url.path,
        current_request_id(),
    )
    return error_response(APIError(INTERNAL, f"internal error: {type(exc).__name__}"))
