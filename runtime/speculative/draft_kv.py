"""The draft model's KV memory, keyed by the target's request ids: per id, the tokens
whose KV it holds (a prefix of that request's sequence) in its own slots and
``req_to_token`` rows, cut back to what the target's sequence still shares, and the
least recently used ids outside a call evicted when a call needs room.

``DraftModel`` (radixlm.runtime.speculative.draft) plans each ``propose`` row here, then
runs the passes that fill the planned slots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.mem_cache.kv_pool import ReqToTokenTable, SlotAllocator

if TYPE_CHECKING:
    from radixlm.runtime.speculative.draft import DraftRow

__all__ = ["DraftHoldings", "Held", "Plan"]


@dataclass
class Held:
    """One request's draft state: the tokens whose KV the draft holds, at positions
    0 .. len(token_ids) - 1, in slots ``req_to_token[row, :len(token_ids)]``."""

    row: int
    token_ids: list[int]
    last_used: int


@dataclass
class Plan:
    """One row's share of a ``propose`` call: its missing tokens are
    ``token_ids[start:]``; it proposes ``num_tokens``; positions 0 .. num_slots - 1
    of its table row have slots (held, then allocated for this call)."""

    index: int
    rid: str
    held: Held
    token_ids: list[int]
    start: int
    num_tokens: int
    num_slots: int
    drafted: list[int] = dataclasses.field(default_factory=list)
    probs: list[torch.Tensor] = dataclasses.field(default_factory=list)


class DraftHoldings:
    """What the draft holds per request id, and the pool and table rows it holds it in.

    Args:
        table: the draft's ``req_to_token`` table.
        num_slots: its KV pool's slots.
        context_len: the draft's context length (no row is planned past it).
    """

    def __init__(self, table: ReqToTokenTable, num_slots: int, context_len: int) -> None:
        self.table = table
        self._allocator = SlotAllocator(num_slots)
        self._context_len = context_len
        self._held: dict[str, Held] = {}
        self._clock = 0

    def tick(self) -> None:
        """A new ``propose`` call: ids planned from now on count as used last."""
        self._clock += 1

    @property
    def capacity(self) -> int:
        """KV slots in the draft's pool (the padding slot aside)."""
        return self._allocator.capacity

    @property
    def num_free_slots(self) -> int:
        return self._allocator.num_free

    def held_token_ids(self, rid: str) -> tuple[int, ...]:
        """The tokens whose KV the draft holds for ``rid`` (empty: none)."""
        held = self._held.get(rid)
        return () if held is None else tuple(held.token_ids)

    def release(self, rid: str) -> None:
        """Frees ``rid``'s KV and table row (the request finished, was aborted or
        retracted); an id the draft holds nothing for is ignored."""
        held = self._held.pop(rid, None)
        if held is None:
            return
        self._allocator.free(self.table.read(held.row, len(held.token_ids)))
        self.table.free_row(held.row)

    def plan(self, index: int, row: DraftRow, batch: set[str]) -> Plan | None:
        """Cuts what ``row.rid`` holds to its common prefix with the row's sequence and
        allocates the slots of its missing tokens and K - 1 drafts (evicting other
        ids); None: the row proposes nothing."""
        token_ids = list(row.token_ids)
        n = len(token_ids)
        num_tokens = min(row.num_tokens, self._context_len - n + 1)
        if num_tokens < 1:  # no room in the draft's context for even one proposal
            self.release(row.rid)
            return None
        held = self._held.get(row.rid)
        if held is not None:
            held.last_used = self._clock
            self._truncate(held, min(_common_prefix(held.token_ids, token_ids), n - 1))
        missing = n - (0 if held is None else len(held.token_ids))
        if self._allocator.num_free + self._evictable(batch) < missing:
            # it would not fit with every other id evicted: evict none
            if held is not None and not held.token_ids:
                self.release(row.rid)
            return None
        if held is None:
            held = self._new_held(row.rid, batch)
            if held is None:
                return None
        self._make_room(missing + num_tokens - 1, batch)
        free = self._allocator.num_free
        num_tokens = min(num_tokens, free - missing + 1)
        slots = self._allocator.allocate(missing + num_tokens - 1)
        assert slots is not None
        self.table.write(held.row, len(held.token_ids), slots)
        start = len(held.token_ids)
        return Plan(index, row.rid, held, token_ids, start, num_tokens, start + len(slots))

    def drop(self, plan: Plan) -> None:
        """Frees every slot of a plan's row (held or allocated) and the row itself."""
        self._allocator.free(self.table.read(plan.held.row, plan.num_slots))
        self.table.free_row(plan.held.row)
        self._held.pop(plan.rid, None)

    def _new_held(self, rid: str, batch: set[str]) -> Held | None:
        """A table row for a new id (evicting another id's when none is free)."""
        row = self.table.allocate_row()
        while row is None and self._evict_one(batch):
            row = self.table.allocate_row()
        if row is None:
            return None
        held = Held(row, [], self._clock)
        self._held[rid] = held
        return held

    def _truncate(self, held: Held, num_tokens: int) -> None:
        """Keeps the first ``num_tokens`` tokens' KV; frees the slots after them."""
        held_slots = self.table.read(held.row, len(held.token_ids))
        self._allocator.free(held_slots[num_tokens:])
        del held.token_ids[num_tokens:]

    def _make_room(self, num_slots: int, batch: set[str]) -> None:
        """Evicts the least recently used ids outside ``batch`` until ``num_slots``
        slots are free or none is left to evict."""
        while self._allocator.num_free < num_slots and self._evict_one(batch):
            pass

    def _evictable(self, batch: set[str]) -> int:
        """Slots the ids outside ``batch`` hold."""
        return sum(len(h.token_ids) for rid, h in self._held.items() if rid not in batch)

    def _evict_one(self, batch: set[str]) -> bool:
        """Releases the least recently used id outside ``batch``; False: none."""
        others = [(h.last_used, rid) for rid, h in self._held.items() if rid not in batch]
        if not others:
            return False
        self.release(min(others)[1])
        return True


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
