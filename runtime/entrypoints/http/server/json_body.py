"""Response bodies as JSON bytes, never built at length on the event loop.

orjson encodes a logprob list several times faster than the standard library
(benchmarks/README.md, "Hostile input") and, like every C encoder, holds the GIL while
it runs; the Python work
around it (turning outputs into dicts) runs in a worker thread, where the event loop
keeps its turns. Non-finite floats become ``null`` (the standard library would write
``NaN``, which is not JSON).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from starlette.responses import Response

from radixlm.runtime.entrypoints.http.server.state import in_worker

__all__ = ["json_bytes", "json_response"]


def json_bytes(payload: Any) -> bytes:
    """``payload`` (dicts, lists, tuples, str, numbers, None) as compact UTF-8 JSON."""
    return orjson.dumps(payload)


async def json_response(build: Callable[[], Any], status_code: int = 200) -> Response:
    """A JSON response of ``build()``, which runs (with the encoding) in a worker thread."""
    body = await in_worker(lambda: json_bytes(build()))
    return Response(body, status_code=status_code, media_type="application/json")
