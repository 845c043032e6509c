"""Server-sent events, as OpenAI-compatible servers stream them: ``data:`` lines make
up an event, a blank line ends it, ``data: [DONE]`` ends the stream, lines starting
with ``:`` are comments (keep-alives), other fields (``event:``, ``id:``) are ignored.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DONE", "SSEParser", "StreamError", "completion_delta", "generate_delta"]

DONE = object()  # what ``feed`` returns for the ``[DONE]`` event


class StreamError(Exception):
    """The server sent an error event inside the stream."""


class SSEParser:
    """Turns lines (without their newline) into events, one ``feed`` per line."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> Any:
        """Returns the JSON payload of the event this line ends, ``DONE`` for the
        end-of-stream event, else None (the event goes on, or the line is no data).

        Raises:
            json.JSONDecodeError: an event's data is not JSON.
        """
        line = line.rstrip("\r")
        if line == "":
            return self._end_event()
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

    def _end_event(self) -> Any:
        if not self._data:
            return None
        data, self._data = "\n".join(self._data), []
        if data == "[DONE]":
            return DONE
        return json.loads(data)


def completion_delta(payload: dict) -> tuple[str, dict | None]:
    """The text a ``text_completion`` chunk adds (choice 0) and its usage, if any.

    Raises:
        StreamError: the payload is an error event.
    """
    if "error" in payload:
        raise StreamError(str(payload["error"]))
    choices = payload.get("choices") or []
    text = (choices[0].get("text") or "") if choices else ""
    return text, payload.get("usage")


def generate_delta(payload: dict) -> tuple[str, int | None]:
    """The text a streamed ``/generate`` event adds (radixlm's ``delta``) and the output
    tokens so far (``meta_info.completion_tokens``).

    Raises:
        StreamError: the payload is an error event.
    """
    if "error" in payload:
        raise StreamError(str(payload["error"]))
    return payload.get("delta") or "", payload.get("meta_info", {}).get("completion_tokens")
