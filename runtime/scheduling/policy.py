"""Admission policy: in which order queued requests are considered, and which of
them should wait a pass for a prefix another request is computing right now.

Ownership: reads the queue, the requests and the prefix cache; mutates nothing
(the ``Scheduler`` owns the queues and moves requests between them).
"""

from __future__ import annotations

from collections.abc import Iterable

from radixlm.runtime.config import SchedulerConfig
from radixlm.runtime.mem_cache.radix_cache import PrefixCache, common_prefix_len
from radixlm.runtime.scheduling.request import Request

__all__ = ["AdmissionPolicy", "SHARED_PREFIX_MIN_TOKENS"]

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
        max_wait, match_len = config.lpm_max_wait_steps, self._cache.match_len

        def key(item: tuple[int, Request]) -> tuple[bool, int, int]:
            arrival, req = item
            starving = now_step - req.queued_at_step > max_wait
            return (not starving, 0 if starving else -match_len(req.all_ids), arrival)

        return [req for _, req in sorted(enumerate(queue), key=key)]

    def waits_for_shared_prefix(self, req: Request, inflight: list[Request]) -> bool:
        """Whether ``req`` shares a long prefix, not yet cached, with a prefill in
        progress (``inflight``): then it waits a pass and reuses that prefix instead
        of computing it a second time."""
        if not self._cache.shares_prefixes or not inflight:
            return False
        ids = req.all_ids
        cached = self._cache.match_len(ids)
        for other in inflight:
            if common_prefix_len(ids, other.all_ids) - cached >= SHARED_PREFIX_MIN_TOKENS:
                return True
        return False
