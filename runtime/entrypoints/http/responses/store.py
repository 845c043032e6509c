"""Responses kept in memory for ``previous_response_id`` and ``GET /v1/responses/{id}``.

Each entry holds two JSON texts: the response body (what GET answers) and the
conversation that produced it (the chat messages a next turn continues from).
Bytes, not objects, so an entry's size is exact and the store's bound is real:

    at most ``max_responses`` entries and ``max_bytes`` of JSON together;
    past either bound, the least recently used entries are dropped.

A conversation grows with each turn and every turn keeps its own copy, so a long
chat costs O(turns^2) bytes; the byte bound is what keeps that in check. Thread
safe (one lock): the non-streamed route stores from a worker thread.

An entry belongs to the API key that stored it (``guard.key_owner``): for any other
key it is as if it did not exist, so one key holder cannot read or delete another's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["ResponseStore", "StoredResponse"]


@dataclass(frozen=True)
class StoredResponse:
    """id: ``resp_...``; body: the response as JSON; conversation: a JSON list of
    OpenAI chat message dicts (without ``instructions``, which do not carry over);
    owner: the key that stored it (None: the server is open)."""

    id: str
    body: bytes
    conversation: bytes
    owner: str | None = None

    @property
    def num_bytes(self) -> int:
        return len(self.body) + len(self.conversation)


class ResponseStore:
    """A bounded LRU map of response id -> StoredResponse.

    Args:
        max_responses: the most entries kept (0: keep none).
        max_bytes: the most bytes of JSON kept, all entries together (0: keep none).
    """

    def __init__(self, max_responses: int, max_bytes: int) -> None:
        if max_responses < 0 or max_bytes < 0:
            raise ValueError(f"bounds must be >= 0, got {max_responses}, {max_bytes}")
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._num_bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_bytes(self) -> int:
        return self._num_bytes

    def put(self, entry: StoredResponse) -> bool:
        """Keeps ``entry`` (replacing one with its id), dropping the least recently
        used entries until both bounds hold. Returns False, keeping nothing, for an
        entry larger than ``max_bytes`` alone (or when the store keeps none)."""
        if entry.num_bytes > self.max_bytes or self.max_responses == 0:
            return False
        with self._lock:
            self._drop(entry.id)
            self._entries[entry.id] = entry
            self._num_bytes += entry.num_bytes
            while len(self._entries) > self.max_responses or self._num_bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
        return True

    def get(self, response_id: str, owner: str | None = None) -> StoredResponse | None:
        """``owner``'s entry (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is None or entry.owner != owner:
                return None
            self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str, owner: str | None = None) -> bool:
        """Whether ``owner`` had such an entry (now dropped)."""
        with self._lock:
            entry = self._entries.get(response_id)
            return entry is not None and entry.owner == owner and self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._num_bytes -= entry.num_bytes
        return True
