"""Admission policy: in which order queued requests are considered, and which of
them should wait a pass for a prefix another request is computing right now.

Ownership: reads the queue, the requests and the prefix cache; mutates nothing
(the ``Scheduler`` owns the queues and moves requests between them).

Cost: an admission round (``AdmissionRound``) looks each request up in the radix
tree at most once, and decides whether a request waits for a shared prefix with one
set lookup, not by comparing it with every prefill in flight.
"""

from __future__ import annotations

from collections.abc import Iterable

from radixlm.runtime.config import SchedulerConfig
from radixlm.runtime.mem_cache.radix_cache import PrefixCache
from radixlm.runtime.scheduling.request import Request

__all__ = ["AdmissionPolicy", "AdmissionRound", "SHARED_PREFIX_MIN_TOKENS"]

# A queued request waits for an in-flight prefill that shares at least this many
# uncached tokens with it; shorter overlaps are cheaper to recompute than to wait for.
SHARED_PREFIX_MIN_TOKENS = 32


class AdmissionPolicy:
    """``config.schedule_policy`` over one prefix cache.

    fcfs: queue order. lpm: longest cached prefix first, except that requests
    queued for more than ``lpm_max_wait_steps`` steps go before all others (FCFS
    among themselves); past ``lpm_max_queue_len`` queued requests lpm falls back
    to FCFS, because it looks every queued request up in the tree each step.
    """

    def __init__(self, config: SchedulerConfig, cache: PrefixCache) -> None:
        self._config = config
        self._cache = cache

    def start_round(self, inflight: Iterable[Request]) -> AdmissionRound:
        """The policy for one admission round, beside the prefills in ``inflight``."""
        return AdmissionRound(self._config, self._cache, inflight)

    def order(self, waiting: Iterable[Request], now_step: int) -> list[Request]:
        """``AdmissionRound.order`` in a round of its own."""
        return self.start_round(()).order(waiting, now_step)

    def waits_for_shared_prefix(self, req: Request, inflight: Iterable[Request]) -> bool:
        """``AdmissionRound.waits_for_shared_prefix`` in a round of its own."""
        return self.start_round(inflight).waits_for_shared_prefix(req)


class AdmissionRound:
    """The policy's decisions during one admission round.

    Valid while the tree's token paths do not change: admission only matches
    (which may split a node) and locks, so a request's cached-prefix length is
    looked up once per round and kept. Start a new round after anything inserts
    into or evicts from the cache.

    Shared prefixes: with c = ``match_len(ids)`` and n = ``SHARED_PREFIX_MIN_TOKENS``,
    a request waits iff some prefill in flight has the same first c + n tokens. Such
    a prefill's own cached prefix is c too (its first c tokens are in the tree, its
    first c + 1 are not), so each prefill files the key ``ids[:c_own + n]`` once and a
    request's test is one set lookup::

        tree:      [ cached: c tokens ]
        in flight: [ c tokens ........ | n tokens ] ...   key = its first c + n
        queued:    [ c tokens ........ | n tokens ] ...   waits iff its key is filed
    """

    def __init__(
        self, config: SchedulerConfig, cache: PrefixCache, inflight: Iterable[Request]
    ) -> None:
        self._config = config
        self._cache = cache
        self._inflight = list(inflight)
        self._match_lens: dict[int, int] = {}  # id(request) -> cached prefix length
        self._keep: list[Request] = []  # keeps the ids above from being reused
        self._shared_keys: set[tuple[int, ...]] | None = None  # built on first use

    def order(self, waiting: Iterable[Request], now_step: int) -> list[Request]:
        """The queued requests in the order admission considers them.

        Args:
            waiting: the queue, front first.
            now_step: the current step (``SchedulerStats.num_steps``); a request's
                wait is ``now_step - req.queued_at_step``.
        """
        queue = list(waiting)
        config = self._config
        if config.schedule_policy == "fcfs" or len(queue) > config.lpm_max_queue_len:
            return queue
        max_wait, match_len = config.lpm_max_wait_steps, self._match_len

        def key(item: tuple[int, Request]) -> tuple[bool, int, int]:
            arrival, req = item
            starving = now_step - req.queued_at_step > max_wait
            return (not starving, 0 if starving else -match_len(req), arrival)

        return [req for _, req in sorted(enumerate(queue), key=key)]

    def waits_for_shared_prefix(self, req: Request) -> bool:
        """Whether ``req`` shares a long prefix, not yet cached, with a prefill in
        progress (those the round started with and those ``add_inflight`` added):
        then it waits a pass and reuses that prefix instead of computing it twice."""
        if not self._cache.shares_prefixes:
            return False
        if self._shared_keys is None:
            self._shared_keys = set()
            for other in self._inflight:
                self._file(other)
        if not self._shared_keys:
            return False
        key = self._shared_key(req)
        return key is not None and key in self._shared_keys

    def add_inflight(self, req: Request) -> None:
        """``req`` was admitted this round: later requests may wait for its prefix."""
        if self._shared_keys is None:
            self._inflight.append(req)
        else:
            self._file(req)

    def _file(self, req: Request) -> None:
        assert self._shared_keys is not None
        key = self._shared_key(req)
        if key is not None:
            self._shared_keys.add(key)

    def _shared_key(self, req: Request) -> tuple[int, ...] | None:
        """Its cached prefix and the next ``SHARED_PREFIX_MIN_TOKENS`` tokens, or
        None when it has fewer tokens past its cached prefix."""
        ids = req.all_ids
        end = self._match_len(req, ids) + SHARED_PREFIX_MIN_TOKENS
        return tuple(ids[:end]) if len(ids) >= end else None

    def _match_len(self, req: Request, ids: list[int] | None = None) -> int:
        n = self._match_lens.get(id(req))
        if n is None:
            n = self._cache.match_len(req.all_ids if ids is None else ids)
            self._match_lens[id(req)] = n
            self._keep.append(req)
        return n
