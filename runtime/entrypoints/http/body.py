"""Request bodies: read once, validated by a pydantic model, refused as a 400
naming the field (or the JSON error) rather than FastAPI's default 422."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from radixlm.runtime.entrypoints.http.errors import validation_error

__all__ = ["parse_body"]

M = TypeVar("M", bound=BaseModel)


async def parse_body(request: Request, model: type[M]) -> M:
    """Raises APIError: 400 for bad JSON or a field of the wrong type or value,
    413 (from the guard) for a body over the size limit."""
    raw = await request.body()
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as e:
        raise validation_error(e.errors(include_url=False)) from e
