"""The checks every request passes before any route sees it: the API key, the body
size limit (an ASGI middleware, so an oversized body is refused unread) and the
deadline for the body to arrive.

    request --> /health, /health_generate? --no--> Authorization: Bearer <one of the keys>?
                                                   (which one: ``key_owner(scope)``)
            --> Content-Length <= limit?
            --> route (reading past the limit raises 413 from ``receive``, reading
                past the deadline 408; once the body is in, ``receive`` only waits
                for a disconnect, with no deadline)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from radixlm.runtime.entrypoints.http.server.errors import (
    REQUEST_TIMEOUT,
    TOO_LARGE,
    UNAUTHORIZED,
    APIError,
)

__all__ = ["GuardMiddleware", "UNGUARDED_PATHS", "key_owner"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Liveness and readiness probes answer without a key (they reveal nothing, and load
# balancers and Kubernetes probes carry no secrets; health.py bounds /health_generate's
# cost to one probe at a time).
UNGUARDED_PATHS = frozenset({"/health", "/health_generate"})
# The scope entry naming the key a request presented (its SHA-256, hex), for what is
# kept per key (stored responses); absent on an open server and unguarded paths.
_OWNER = "radixlm.key_owner"


def key_owner(scope: Scope) -> str | None:
    """Which key the request was let in with (None: the server is open)."""
    return scope.get(_OWNER)


class GuardMiddleware:
    """api_keys: the keys let in (a str: one; None or empty: open); max_body_bytes: the
    most request body bytes read; body_timeout_s: how long the whole body may take to
    arrive."""

    def __init__(
        self,
        app: Any,
        api_keys: str | Iterable[str] | None,
        max_body_bytes: int,
        body_timeout_s: float,
    ) -> None:
        self.app = app
        keys = (api_keys,) if isinstance(api_keys, str) else tuple(api_keys or ())
        # Looked up by digest: the time taken says nothing about how close a guess was,
        # however many keys there are.
        digests = [_digest(key.encode("utf-8")) for key in keys]
        self._owners = {digest: digest.hex() for digest in digests}
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await _send_error(send, refusal)
            return
        await self.app(scope, self._limited(receive), send)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> APIError | None:
        if self._owners and scope["path"] not in UNGUARDED_PATHS:
            owner = self._owner(headers.get("authorization", ""))
            scope[_OWNER] = owner
            if owner is None:
                return APIError(
                    UNAUTHORIZED,
                    "missing or wrong API key: send 'Authorization: Bearer <key>'",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return self._too_large()
        return None

    def _owner(self, header: str) -> str | None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self._owners.get(_digest(token.strip().encode("utf-8")))

    def _too_large(self) -> APIError:
        return APIError(
            TOO_LARGE, f"the request body exceeds this server's {self.max_body_bytes} bytes"
        )

    def _limited(self, receive: Receive) -> Receive:
        """``receive`` that raises 413 once a (chunked) body passes the limit and 408
        when the body is not in by the deadline."""
        seen, body_done = 0, False
        deadline = asyncio.get_running_loop().time() + self.body_timeout_s

        async def limited() -> Message:
            nonlocal seen, body_done
            if body_done:  # from here on only a disconnect comes: wait as long as it takes
                return await receive()
            try:
                left = deadline - asyncio.get_running_loop().time()
                message = await asyncio.wait_for(receive(), max(left, 0.0))
            except TimeoutError:
                raise self._body_late() from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise self._too_large()
                body_done = not message.get("more_body", False)
            return message

        return limited

    def _body_late(self) -> APIError:
        return APIError(
            REQUEST_TIMEOUT,
            f"the request body did not arrive within {self.body_timeout_s:g} s",
            headers={"Connection": "close"},
        )


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def _send_error(send: Send, error: APIError) -> None:
    body = json.dumps(error.body()).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
