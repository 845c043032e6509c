"""Server-sent events framing: one ``data:`` line per event, a blank line after it.

OpenAI's and SGLang's streams both end with the literal event ``data: [DONE]``.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["SSE_DONE", "sse_event"]

SSE_DONE = b"data: [DONE]\n\n"


def sse_event(payload: Any) -> bytes:
    """One event carrying ``payload`` as compact JSON (never spanning lines: JSON
    escapes every newline inside strings); orjson, as ``json_body``."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"
