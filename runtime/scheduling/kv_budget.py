"""The KV budget: how many slots a pass may use, and every move of a request's KV.

Ownership: a ``KVBudget`` is the scheduler side's only user of the slot
allocator, the req_to_token table and the prefix cache's match / lock / insert
calls. It sets a request's KV fields (``row``, ``prefix_node``,
``num_computed_tokens``, ``num_cached_tokens``, ``num_retractions``); the
``Scheduler`` owns the queues and a request's status.

A running request's KV::

    req_to_token[row]:  [ 0 ........ p ) [ p ........ num_computed_tokens )
                          cached prefix,   its own slots, handed to the cache
                          locked, tree-owned   when it finishes or is retracted
    (p = cache.prefix_len(prefix_node))

    free slots + cache.total_size + own slots of all running requests == capacity

Every write to ``req_to_token`` goes through ``_write_prefix`` or ``_write_pass``; every
read is of its host copy (``_row_slots``): admitting, caching, releasing, retracting or
truncating a request never waits for the device. The step's writes reach the device
table in one copy, when ``allocate_pass`` (the last write of a step) flushes them.
"""

from __future__ import annotations

import math

import torch

from radixlm.runtime.config import SchedulerConfig
from radixlm.runtime.mem_cache.kv_pool import ReqToTokenTable, SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import PrefixCache
from radixlm.runtime.scheduling.request import Request
from radixlm.runtime.scheduling.stats import SchedulerStats

__all__ = ["KVBudget"]

# Admission counts at most this many of a request's remaining new tokens (as SGLang
# clips its estimate): max_new_tokens near the context length would otherwise make
# one request look as if it needed a whole pool it will rarely use.
_MAX_NEW_TOKENS_ESTIMATE = 4096


class KVBudget:
    """Slots, req_to_token rows and the prefix cache, seen from the scheduler."""

    def __init__(
        self,
        config: SchedulerConfig,
        allocator: SlotAllocator,
        req_to_token: ReqToTokenTable,
        cache: PrefixCache,
        stats: SchedulerStats,
    ) -> None:
        self.allocator = allocator
        self.req_to_token = req_to_token
        self.cache = cache
        self._config = config
        self._stats = stats
        # the share of a request's remaining max_new_tokens admission expects it to use
        self.new_token_ratio = config.init_new_token_ratio
        self._ratio_decay = self._decay_per_pass()

    # ---- planning ----------------------------------------------------------------------

    @property
    def available_slots(self) -> int:
        """Free slots plus those the prefix cache can evict on demand."""
        return self.allocator.num_free + self.cache.evictable_size

    def can_admit(self, req: Request, num_running: int, reserved: int, num_planned: int) -> bool:
        """Whether ``req`` may start now beside ``num_running`` requests that are
        expected to need ``reserved`` more slots (``reserved_need``), with
        ``num_planned`` slots already promised to this pass: a table row is free,
        the running limit is not reached, and what ``req`` will need fits in what
        the running requests leave. An idle engine always admits one request (a
        lone request always fits)."""
        if self.req_to_token.num_free_rows == 0:
            return False
        if num_running >= self._config.max_running_requests:
            return False
        available = self.available_slots
        if num_running == 0 and num_planned == 0:
            return available > 0
        if available - num_planned <= 0:
            return False
        return self.future_need(req) <= available - reserved

    def reserved_need(self, running: list[Request]) -> int:
        """The slots the ``running`` requests are expected to take beyond those they hold."""
        return sum(self.future_need(r) for r in running)

    def future_need(self, req: Request) -> int:
        """Slots ``req`` is expected to take beyond those it holds: its tokens not yet
        computed plus ``new_token_ratio`` of the new tokens it may still generate
        (at most ``_MAX_NEW_TOKENS_ESTIMATE`` of them count)."""
        remaining = max(req.params.max_new_tokens - len(req.output_ids), 0)
        remaining = min(remaining, _MAX_NEW_TOKENS_ESTIMATE)
        return req.num_pending_tokens + math.ceil(self.new_token_ratio * remaining)

    def decay_new_token_ratio(self) -> None:
        """One pass ran: admission grows bolder, down to the minimum ratio."""
        floor = self._config.min_new_token_ratio
        self.new_token_ratio = max(self.new_token_ratio - self._ratio_decay, floor)

    def raise_new_token_ratio(self) -> None:
        """A decode had to retract a request: the estimate was too low, so it moves
        halfway to 1 (keep all the room the running requests may ask for), to fall
        back to the minimum over ``new_token_ratio_decay_steps`` passes."""
        self.new_token_ratio += (1.0 - self.new_token_ratio) / 2
        self._ratio_decay = self._decay_per_pass()

    def _decay_per_pass(self) -> float:
        config = self._config
        return (self.new_token_ratio - config.min_new_token_ratio) / (
            config.new_token_ratio_decay_steps
        )

    # ---- a request's KV ----------------------------------------------------------------

    def admit(self, req: Request) -> None:
        """Gives ``req`` a req_to_token row holding its longest reusable cached prefix
        (locked) and counts that prefix as computed (and, on a first admission, as
        cached). The caller checked ``can_admit``."""
        row = self.req_to_token.allocate_row()
        assert row is not None  # can_admit checked
        req.row = row
        match = self.cache.match_prefix(req.all_ids[: _reusable_prefix_len(req)])
        self.cache.lock(match.last_node)
        req.prefix_node = match.last_node
        self._write_prefix(row, match.slots)
        req.num_computed_tokens = match.num_tokens
        if req.num_retractions == 0:
            req.num_cached_tokens = match.num_tokens
            self._stats.num_cached_tokens += match.num_tokens * req.log_metrics

    def retract(self, req: Request) -> None:
        """Takes a running request's KV back (into the cache); it is recomputed when
        the request is admitted again."""
        self.release(req)
        req.num_retractions += 1
        self._stats.num_retractions += 1

    def release(self, req: Request) -> None:
        """Hands the request's KV to the prefix cache (which frees what it does not
        keep) and its row back to the table."""
        assert req.row is not None and req.prefix_node is not None
        # a request that finished inside a verified proposal holds slots past its end,
        # one that finished while a pass ran ahead of it holds that pass's slots
        self.truncate(req, req.num_settled_tokens)
        n = req.num_computed_tokens
        self.cache.cache_finished(req.all_ids[:n], self._row_slots(req.row, n), req.prefix_node)
        self.req_to_token.free_row(req.row)
        req.row = None
        req.prefix_node = None
        req.num_computed_tokens = 0

    def truncate(self, req: Request, num_tokens: int) -> None:
        """Keeps the KV of the first ``num_tokens`` computed positions of a running
        request and frees its slots after them (rejected speculative tokens); the
        stale ``req_to_token`` entries are overwritten by the pass that computes
        those positions again."""
        assert req.row is not None
        n = req.num_computed_tokens
        if num_tokens >= n:
            return
        assert num_tokens >= self.cache.prefix_len(req.prefix_node), "cannot cut a cached prefix"
        self.allocator.free(self._row_slots(req.row, n)[num_tokens:])
        req.num_computed_tokens = num_tokens

    def cache_computed_prefix(self, req: Request) -> None:
        """Shares a prefill's tokens as soon as they are computed (not only when the
        request ends), so requests queued behind it with the same prefix reuse them."""
        assert req.row is not None and req.prefix_node is not None
        n = req.num_settled_tokens
        match = self.cache.cache_unfinished(
            req.all_ids[:n], self._row_slots(req.row, n), req.prefix_node
        )
        self._write_prefix(req.row, match.slots)
        req.prefix_node = match.last_node

    # ---- a pass's slots ----------------------------------------------------------------

    def allocate_pass(
        self, rows: torch.Tensor, extend_lens: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """(T,) new slots for a pass, evicting from the cache on demand, recorded in
        req_to_token: request b's tokens go to ``rows[b]`` at their ``positions``.

        Args:
            rows, extend_lens: (B,) each request's row and number of new tokens.
            positions: (T,) absolute position of each new token, request after request.
        """
        slots = self._allocate(int(positions.numel()))
        self._write_pass(torch.repeat_interleave(rows, extend_lens), positions, slots)
        # the pass's own writes are the step's last: the step's table writes (admitted
        # prefixes, cached prefills, this pass's slots) reach the device together now
        self.req_to_token.flush()
        return slots

    def free_pass(self, slots: torch.Tensor) -> None:
        """Gives back the slots of a pass that failed and was undone: its requests'
        ``req_to_token`` entries there are rewritten by the pass that recomputes them."""
        self.allocator.free(slots)

    def _allocate(self, num_tokens: int) -> torch.Tensor:
        shortfall = num_tokens - self.allocator.num_free
        if shortfall > 0:
            self.cache.evict(shortfall)
        slots = self.allocator.allocate(num_tokens)
        assert slots is not None  # the scheduler only plans work that fits
        return slots

    # ---- req_to_token: the only reads and writes ----------------------------------------

    def _row_slots(self, row: int, num_tokens: int) -> torch.Tensor:
        """(num_tokens,) slots of positions [0, num_tokens) of ``row``, on the CPU (a
        view while the table is there)."""
        return self.req_to_token.read(row, num_tokens)

    def _write_prefix(self, row: int, slots: torch.Tensor) -> None:
        """Positions [0, len(slots)) of ``row`` now live in ``slots``."""
        self.req_to_token.write(row, 0, slots)

    def _write_pass(
        self, token_rows: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor
    ) -> None:
        """(T,) each: position ``positions[t]`` of row ``token_rows[t]`` lives in ``slots[t]``."""
        self.req_to_token.write_positions(token_rows, positions, slots)


def _reusable_prefix_len(req: Request) -> int:
    """How much of a request may come from the cache: all but the last token (a
    pass must produce logits to sample from), and nothing from the first prompt
    position whose logprob is wanted on (those logits must be computed)."""
    limit = req.num_total_tokens - 1
    wanted = req.logprob
    if wanted.enabled and wanted.start_len < len(req.prompt_ids):
        limit = min(limit, max(wanted.start_len, 1) - 1)
    return limit
