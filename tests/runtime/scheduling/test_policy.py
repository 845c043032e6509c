"""AdmissionPolicy: queue order (fcfs, lpm with anti-starvation and its queue-length
fallback) and the wait-for-shared-prefix rule, on a real radix tree."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.runtime.config import SchedulerConfig
from radixlm.runtime.mem_cache.kv_pool import SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import DisabledCache, RadixCache
from radixlm.runtime.scheduling import policy as policy_module
from radixlm.runtime.scheduling.policy import SHARED_PREFIX_MIN_TOKENS, AdmissionPolicy
from radixlm.runtime.scheduling.request import Request
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


# ---- one admission round: the decisions pinned, and what they cost ----------------------

N = SHARED_PREFIX_MIN_TOKENS


def fresh(start: int, num_tokens: int) -> list[int]:
    return list(range(start, start + num_tokens))


def reference_waits(cache, req, inflight) -> bool:
    """The rule as first written: compare ``req`` with every prefill in flight."""
    if not cache.shares_prefixes or not inflight:
        return False
    ids, cached = req.all_ids, cache.match_len(req.all_ids)
    return any(_reference_shared(ids, other.all_ids) - cached >= N for other in inflight)


def _reference_shared(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def run_round(policy, waiting, inflight, now_step=0, check=True):
    """What ``PrefillPlanner._admit_waiting`` asks, admitting everyone who need not wait:
    (rids admitted, in order; rids that wait). ``check``: each answer is the
    pairwise rule's (``reference_waits``) given who is in flight at that point."""
    round_ = policy.start_round(inflight)
    running, admitted, waited = list(inflight), [], []
    for req in round_.order(waiting, now_step):
        waits = round_.waits_for_shared_prefix(req)
        if check:
            assert waits == reference_waits(policy._cache, req, running), req.rid
        (waited if waits else admitted).append(req.rid)
        if not waits:
            round_.add_inflight(req)
            running.append(req)
    return admitted, waited


def test_a_round_waits_exactly_for_long_uncached_prefixes_shared_at_any_depth():
    cache = cache_with_base()  # BASE (20 tokens) cached
    f, g = fresh(3000, 60), fresh(4000, 60)
    inflight = [request("x", BASE + f), request("y", g + [1, 2])]
    cases = {
        "base+f32": (BASE + f[:N] + [9], True),  # 32 uncached shared with x after BASE
        "base+f31": (BASE + f[: N - 1] + [9], False),  # one short
        "base10+f": (BASE[:10] + f, False),  # leaves x inside the cached prefix
        "g32": (g[:N] + [5], True),  # nothing cached: 32 shared with y
        "g-all": (g + [1, 2], True),  # y's own prompt
        "f-alone": (f, False),  # x's new tokens, but not after BASE
        "short": (BASE + f[:5], False),  # fewer than N tokens past its cached prefix
    }
    policy = AdmissionPolicy(SchedulerConfig(schedule_policy="fcfs"), cache)
    round_ = policy.start_round(inflight)
    for rid, (ids, expected) in cases.items():
        req = request(rid, ids)
        assert round_.waits_for_shared_prefix(req) is expected, rid
        assert reference_waits(cache, req, inflight) is expected, rid


def test_requests_admitted_in_a_round_are_waited_for_by_later_ones():
    """64 queued requests: 8 groups of 8 sharing 16 * (k + 1) uncached tokens (group
    k) after the cached BASE. Where that is at least N tokens, the group's first
    request starts and the other seven wait for it."""
    cache = cache_with_base()
    waiting = []
    for k in range(8):
        shared = fresh(10_000 * (k + 1), 16 * (k + 1))
        waiting += [request(f"g{k}r{j}", BASE + shared + [50_000 + j] * 3) for j in range(8)]
    for schedule_policy in ("lpm", "fcfs"):
        policy = AdmissionPolicy(SchedulerConfig(schedule_policy=schedule_policy), cache)
        admitted, waited = run_round(policy, waiting, [])
        assert admitted == [f"g{k}r{j}" for k in range(8) for j in range(8) if k == 0 or j == 0]
        assert waited == [f"g{k}r{j}" for k in range(1, 8) for j in range(1, 8)]


def test_lpm_orders_many_cached_lengths_with_starving_requests_first():
    cache = cache_with_base()
    waiting = [request(f"c{n}", BASE[:n] + fresh(10_000 * (n + 1), 5)) for n in range(0, 21, 4)]
    for i, req in enumerate(waiting):
        req.queued_at_step = 0 if i in (1, 4) else 9  # c4 and c16 starve at step 10
    policy = AdmissionPolicy(SchedulerConfig(lpm_max_wait_steps=5), cache)
    admitted, waited = run_round(policy, waiting, [], now_step=10)
    assert admitted == ["c4", "c16", "c20", "c12", "c8", "c0"] and waited == []


def test_a_queue_sharing_nothing_is_admitted_in_order_and_nobody_waits():
    cache = cache_with_base()
    waiting = [request(f"r{i}", fresh(100_000 * (i + 1), 3 * N)) for i in range(40)]
    waiting.append(request("cached", BASE + fresh(7_000, 3 * N)))  # longest cached prefix
    inflight = [request("in", fresh(77_000_000, 3 * N))]
    admitted, waited = run_round(AdmissionPolicy(SchedulerConfig(), cache), waiting, inflight)
    assert admitted == ["cached"] + [f"r{i}" for i in range(40)] and waited == []


def test_a_long_queue_falls_back_to_fcfs_and_still_waits_for_shared_prefixes():
    cache = cache_with_base()
    config = SchedulerConfig(lpm_max_queue_len=16)
    shared = fresh(5_000, N)
    waiting = [request(f"r{i}", fresh(100_000 * (i + 1), N + 1)) for i in range(16)]
    waiting += [request("s0", shared + [1]), request("s1", BASE + [2]), request("s2", shared + [3])]
    admitted, waited = run_round(AdmissionPolicy(config, cache), waiting, [])
    assert admitted == [f"r{i}" for i in range(16)] + ["s0", "s1"]  # 19 > 16: FCFS
    assert waited == ["s2"]
    admitted, waited = run_round(AdmissionPolicy(config, cache), waiting[3:], [])
    assert admitted == ["s1"] + [f"r{i}" for i in range(3, 16)] + ["s0"]  # 16: lpm
    assert waited == ["s2"]


BLOCKS = [fresh(1_000 * (b + 1), length) for b, length in enumerate((8, 16, 24, 40))]
prompts = st.tuples(
    st.lists(st.integers(0, len(BLOCKS) - 1), max_size=4),
    st.lists(st.integers(0, 2), max_size=3),
).map(lambda t: [7] + [tok for b in t[0] for tok in BLOCKS[b]] + t[1])


@settings(max_examples=200, deadline=None)
@given(
    cached=st.lists(prompts, max_size=3),
    inflight=st.lists(prompts, max_size=4),
    waiting=st.lists(prompts, min_size=1, max_size=8),
    schedule_policy=st.sampled_from(["lpm", "fcfs"]),
)
def test_a_round_decides_as_the_pairwise_rule_on_prompts_built_of_shared_blocks(
    cached, inflight, waiting, schedule_policy
):
    """Prompts built from blocks of 8 .. 40 tokens share prefixes of many lengths,
    cached, in flight, or both."""
    allocator = SlotAllocator(1_000)
    cache = RadixCache(allocator.free)
    for ids in cached:
        slots = allocator.allocate(len(ids))
        assert slots is not None
        allocator.free(slots[: cache.insert(ids, slots)])
    policy = AdmissionPolicy(SchedulerConfig(schedule_policy=schedule_policy), cache)
    queue_ = [request(f"q{i}", ids) for i, ids in enumerate(waiting)]
    running = [request(f"in{i}", ids) for i, ids in enumerate(inflight)]
    admitted, waited = run_round(policy, queue_, running)  # checks every answer
    assert sorted(admitted + waited) == sorted(r.rid for r in queue_)


class CountingCache(RadixCache):
    def __init__(self, free_slots) -> None:
        super().__init__(free_slots)
        self.num_lookups = 0

    def match_len(self, ids):
        self.num_lookups += 1
        return super().match_len(ids)


def round_cost(num_waiting: int, num_prefix_tokens: int, monkeypatch) -> tuple[int, int, int]:
    """(tree lookups, prefix comparisons, prompt reads) of one round in which
    ``num_waiting`` queued requests and as many prefills in flight share a cached
    prefix of ``num_prefix_tokens`` (and need not wait for each other)."""
    from radixlm.runtime.mem_cache import radix_cache

    counts = {"compare": 0, "read": 0}
    real_compare, real_read = radix_cache.common_prefix_len, Request.all_ids.fget

    def compare(*args):
        counts["compare"] += 1
        return real_compare(*args)

    def read(req):
        counts["read"] += 1
        return real_read(req)

    allocator = SlotAllocator(num_prefix_tokens + 1)
    cache = CountingCache(allocator.free)
    prefix = fresh(1_000, num_prefix_tokens)
    slots = allocator.allocate(num_prefix_tokens)
    assert slots is not None
    cache.insert(prefix, slots)
    inflight = [request(f"in{i}", prefix + [i] * (N + 8)) for i in range(num_waiting)]
    waiting = [request(f"q{i}", prefix + [-1 - i] * (N + 8)) for i in range(num_waiting)]
    for module in (radix_cache, policy_module):  # wherever a comparison may be made
        monkeypatch.setattr(module, "common_prefix_len", compare, raising=False)
    monkeypatch.setattr(Request, "all_ids", property(read))
    policy = AdmissionPolicy(SchedulerConfig(), cache)
    admitted, waited = run_round(policy, waiting, inflight, check=False)
    monkeypatch.undo()
    assert len(admitted) == num_waiting and not waited
    return cache.num_lookups, counts["compare"], counts["read"]


def test_a_round_reads_each_prompt_once_whatever_the_queue_and_prompt_length(monkeypatch):
    """A round's work grows with its requests, not with waiting x in flight (no pair
    is compared), and not with the prompts' length (comparisons go edge by edge)."""
    lookups, comparisons, reads = round_cost(16, 200, monkeypatch)
    assert lookups == 2 * 16  # each queued request and each prefill in flight, once
    assert comparisons == lookups  # one edge on each path (the shared prefix)
    assert reads <= 2 * lookups
    assert round_cost(16, 4_000, monkeypatch) == (lookups, comparisons, reads)
    assert round_cost(64, 200, monkeypatch) == (4 * lookups, 4 * comparisons, 4 * reads)
