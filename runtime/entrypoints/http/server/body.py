"""Request bodies: read once, validated by a pydantic model, refused as a 400
naming the field (or the JSON error) rather than FastAPI's default 422.

A body's lists can be capped (``max_items``): validating hundreds of thousands of
input items takes pydantic seconds, all of it holding the GIL (a worker thread would
not free the event loop), so a large body's lists are counted first from orjson's
parse, which is far cheaper (benchmarks/README.md, "Hostile input").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from radixlm.runtime.entrypoints.http.server.errors import INVALID, APIError, validation_error

__all__ = ["ItemCap", "parse_body"]

M = TypeVar("M", bound=BaseModel)
# A body this short cannot hold a list long enough to cost more than its own parse.
_COUNTED_FROM_BYTES = 4096


class ItemCap(NamedTuple):
    """The most items a list field may hold, and the server setting that says so."""

    limit: int
    setting: str


async def parse_body(
    request: Request, model: type[M], max_items: Mapping[str, ItemCap] | None = None
) -> M:
    """Raises APIError: 400 for bad JSON or a field of the wrong type or value,
    400 ``request_limit_exceeded`` for a list field of ``max_items`` (field -> cap)
    holding more than its cap, 413 (from the guard) for a body over the size limit."""
    raw = await request.body()
    if max_items and len(raw) > _COUNTED_FROM_BYTES:
        _check_counts(raw, max_items)
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as e:
        raise validation_error(e.errors(include_url=False)) from e


def _check_counts(raw: bytes, max_items: Mapping[str, ItemCap]) -> None:
    try:
        fields = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return  # pydantic names the JSON error
    if not isinstance(fields, dict):
        return
    for name, (limit, setting) in max_items.items():
        value = fields.get(name)
        if isinstance(value, list) and len(value) > limit:
            raise APIError(
                INVALID,
                f"{name} holds {len(value)} items; this server takes at most {limit} ({setting})",
                name,
                code="request_limit_exceeded",
            )
