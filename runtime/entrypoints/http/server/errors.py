"""Every failure the server answers, as OpenAI's error body and an HTTP status.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "n", "code": null}}

``APIError`` is raised by the server's own checks; ``api_error_from`` maps what
the engine raises (its ``ValueError`` subclasses name the field at fault) by the
exception's class, most specific first, through one table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixlm.runtime.errors import (
    ContextLengthError,
    EngineStoppedError,
    GrammarError,
    InvalidRequestError,
    InvalidSamplingParamsError,
    RadixLMError,
    RequestLimitError,
)

__all__ = ["APIError", "ErrorKind", "api_error_from", "validation_error"]


@dataclass(frozen=True)
class ErrorKind:
    """An HTTP status and OpenAI's ``type`` (and default ``code``) for one kind of failure."""

    status: int
    type: str
    code: str | None = None


INVALID = ErrorKind(400, "invalid_request_error")
UNAUTHORIZED = ErrorKind(401, "authentication_error", "invalid_api_key")
NOT_FOUND = ErrorKind(404, "invalid_request_error", "model_not_found")
REQUEST_TIMEOUT = ErrorKind(408, "invalid_request_error", "request_timeout")
TOO_LARGE = ErrorKind(413, "invalid_request_error", "request_too_large")
OVERLOADED = ErrorKind(503, "server_error", "server_overloaded")
STOPPED = ErrorKind(503, "server_error", "engine_stopped")
INTERNAL = ErrorKind(500, "server_error", "internal_error")


class APIError(Exception):
    """An answer that is an error: ``kind`` gives the status, the rest the body.

    headers: extra response headers (``Retry-After`` on 503, ``WWW-Authenticate`` on 401).
    """

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param
        self.code = code if code is not None else kind.code
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return self.kind.status

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind.type,
                "param": self.param,
                "code": self.code,
            }
        }


# The engine's errors, by class; api_error_from walks an exception's MRO, so the most
# specific entry wins (a GrammarError is an InvalidSamplingParamsError is a ValueError).
_ENGINE_ERRORS: dict[type, tuple[ErrorKind, str | None]] = {
    GrammarError: (INVALID, "invalid_grammar"),
    ContextLengthError: (INVALID, "context_length_exceeded"),
    RequestLimitError: (INVALID, "request_limit_exceeded"),
    InvalidSamplingParamsError: (INVALID, None),
    InvalidRequestError: (INVALID, None),
    EngineStoppedError: (STOPPED, None),
    RadixLMError: (INTERNAL, None),
    ValueError: (INVALID, None),
}


def api_error_from(exc: BaseException, param_names: dict[str, str] | None = None) -> APIError:
    """The answer for an exception the engine raised.

    Args:
        exc: what was raised.
        param_names: engine field name -> the name the client used (``max_new_tokens``
            -> ``max_tokens`` on the OpenAI routes), for the error's ``param``.
    """
    if isinstance(exc, APIError):
        return exc
    for cls in type(exc).__mro__:
        if cls in _ENGINE_ERRORS:
            kind, code = _ENGINE_ERRORS[cls]
            break
    else:
        kind, code = INTERNAL, None
    field = getattr(exc, "field", None)
    if isinstance(field, str) and param_names:
        field = param_names.get(field, field)
    message = str(exc) if kind is not INTERNAL else f"internal error: {type(exc).__name__}: {exc}"
    return APIError(kind, message, param=field if isinstance(field, str) else None, code=code)


def validation_error(errors: list[dict[str, Any]]) -> APIError:
    """The answer for a body pydantic refused: its first error, with the field's path.

    ``loc`` starts with ``"body"``; a JSON decode error has the byte offset after it.
    The union members pydantic tried (``literal['none','auto']``, ``NamedToolChoice``)
    are left out of the path: ``param`` names only fields and indices.
    """
    first = errors[0] if errors else {"msg": "invalid request body", "loc": ()}
    loc = [str(part) for part in first.get("loc", ()) if part != "body" and not _is_tag(part)]
    if first.get("type") == "json_invalid":
        return APIError(
            INVALID, f"the body is not valid JSON: {first.get('msg')}", code="json_invalid"
        )
    param = ".".join(loc) or None
    where = f"{param}: " if param else ""
    return APIError(INVALID, f"{where}{first.get('msg', 'invalid value')}", param=param)


def _is_tag(part: Any) -> bool:
    """A union member's tag in a ``loc``: not a field name (fields are snake_case)."""
    return isinstance(part, str) and (part[:1].isupper() or not part.isidentifier())
