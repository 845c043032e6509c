"""AdmissionPolicy: queue order (fcfs, lpm with anti-starvation and its queue-length
fallback) and the wait-for-shared-prefix rule, on a real radix tree."""

from __future__ import annotations

from radixlm.runtime.config import SchedulerConfig
from radixlm.runtime.mem_cache.kv_pool import SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import DisabledCache, RadixCache
from radixlm.runtime.scheduling.policy import SHARED_PREFIX_MIN_TOKENS, AdmissionPolicy
from tests.runtime.scheduling.helpers import request

BASE = list(range(1000, 1020))  # cached: 20 tokens


def cache_with_base() -> RadixCache:
    allocator = SlotAllocator(101)
    cache = RadixCache(allocator.free)
    slots = allocator.allocate(len(BASE))
    assert slots is not None
    cache.insert(BASE, slots)
    return cache


def queue():
    """Arrival order a, b, c, d; cached prefix 0, 10, 20, 20; queued at steps 0, 8, 9, 0."""
    a = request("a", [900, 901, 902])
    b = request("b", BASE[:10] + [5, 6])
    c = request("c", BASE + [7])
    d = request("d", BASE + [8])
    for req, step in zip((a, b, c, d), (0, 8, 9, 0)):
        req.queued_at_step = step
    return [a, b, c, d]


def rids(reqs) -> list[str]:
    return [r.rid for r in reqs]


def test_lpm_puts_starving_requests_first_then_longest_cached_prefix():
    config = SchedulerConfig(schedule_policy="lpm", lpm_max_wait_steps=3)
    policy = AdmissionPolicy(config, cache_with_base())
    # now 10: a and d waited 10 > 3 steps (FCFS among themselves); then c (20), b (10)
    assert rids(policy.order(queue(), now_step=10)) == ["a", "d", "c", "b"]
    # now 3: nobody starves (d waited exactly 3); c and d tie on 20: arrival decides
    assert rids(policy.order(queue(), now_step=3)) == ["c", "d", "b", "a"]


def test_fcfs_and_a_long_queue_keep_arrival_order():
    cache = cache_with_base()
    fcfs = AdmissionPolicy(SchedulerConfig(schedule_policy="fcfs"), cache)
    assert rids(fcfs.order(queue(), now_step=3)) == ["a", "b", "c", "d"]
    long_queue = AdmissionPolicy(SchedulerConfig(lpm_max_queue_len=3), cache)
    assert rids(long_queue.order(queue(), now_step=3)) == ["a", "b", "c", "d"]
    assert rids(long_queue.order(queue()[1:], now_step=3)) == ["c", "d", "b"]  # 3: lpm


def test_a_request_waits_only_for_a_long_uncached_shared_prefix():
    policy = AdmissionPolicy(SchedulerConfig(), cache_with_base())
    n = SHARED_PREFIX_MIN_TOKENS
    fresh = list(range(2000, 2000 + n))  # uncached
    inflight = [request("in", fresh + [1])]
    assert policy.waits_for_shared_prefix(request("q", fresh + [2]), inflight)
    assert not policy.waits_for_shared_prefix(request("q", fresh[:-1] + [2]), inflight)
    assert not policy.waits_for_shared_prefix(request("q", fresh + [2]), [])
    # 20 of the 20 + n - 1 shared tokens are cached: n - 1 left to share, not enough
    cached_start = [request("in", BASE + fresh[:-1] + [1])]
    assert not policy.waits_for_shared_prefix(request("q", BASE + fresh[:-1] + [2]), cached_start)
    no_sharing = AdmissionPolicy(SchedulerConfig(), DisabledCache(lambda slots: None))
    assert not no_sharing.waits_for_shared_prefix(request("q", fresh + [2]), inflight)
