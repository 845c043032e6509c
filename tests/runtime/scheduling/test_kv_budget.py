"""KVBudget: admission, a pass's slots, caching, retraction and release keep every
slot accounted for (free + cached + running requests' own == capacity)."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.config import SchedulerConfig
from radixlm.runtime.mem_cache.kv_pool import ReqToTokenTable, SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import RadixCache
from radixlm.runtime.scheduling.kv_budget import KVBudget
from radixlm.runtime.scheduling.request import Request
from radixlm.runtime.scheduling.stats import SchedulerStats
from tests.runtime.scheduling.helpers import request

CAPACITY = 50


def make_budget(
    stats: SchedulerStats | None = None, config: SchedulerConfig | None = None
) -> KVBudget:
    config = config or SchedulerConfig(max_running_requests=4)
    allocator = SlotAllocator(CAPACITY + 1)
    cache = RadixCache(allocator.free)
    stats = stats or SchedulerStats()
    return KVBudget(config, allocator, ReqToTokenTable(4, 64), cache, stats)


def run_pass(budget: KVBudget, req: Request) -> torch.Tensor:
    """Computes all of ``req``'s pending tokens (what a pass and process_output do)."""
    start, n = req.num_computed_tokens, req.num_pending_tokens
    rows = torch.tensor([req.row])
    slots = budget.allocate_pass(rows, torch.tensor([n]), torch.arange(start, start + n))
    req.num_computed_tokens = start + n
    return slots


def accounting(budget: KVBudget, running: list[Request]) -> tuple[int, int, int]:
    """(free, cached, own) where own counts running requests' slots beyond their
    locked cached prefix."""
    cache = budget.cache
    own = sum(r.num_computed_tokens - cache.prefix_len(r.prefix_node) for r in running)
    free, cached = budget.allocator.num_free, cache.total_size
    assert free + cached + own == CAPACITY
    return free, cached, own


def test_admit_pass_cache_retract_release_conserve_slots():
    stats = SchedulerStats()
    budget = make_budget(stats=stats)
    prompt = list(range(100, 110))
    a = request("a", prompt)
    budget.admit(a)
    assert (a.row, a.num_computed_tokens) == (0, 0)
    assert accounting(budget, [a]) == (50, 0, 0)
    slots_a = run_pass(budget, a)
    assert budget.req_to_token.table[0, :10].tolist() == slots_a.tolist()
    assert accounting(budget, [a]) == (40, 0, 10)
    budget.cache_computed_prefix(a)  # the tree owns a's 10 tokens now, locked by a
    assert accounting(budget, [a]) == (40, 10, 0)
    assert budget.cache.protected_size == 10

    b = request("b", prompt + [110, 111])
    budget.admit(b)  # reuses a's 10 tokens
    assert (b.row, b.num_computed_tokens, b.num_cached_tokens) == (1, 10, 10)
    assert budget.req_to_token.table[1, :10].tolist() == slots_a.tolist()
    run_pass(budget, b)
    assert accounting(budget, [a, b]) == (38, 10, 2)

    budget.retract(b)  # its 2 own tokens go into the tree, unlocked
    assert (b.row, b.prefix_node, b.num_computed_tokens, b.num_retractions) == (None, None, 0, 1)
    assert accounting(budget, [a]) == (38, 12, 0)
    assert (stats.num_retractions, stats.num_cached_tokens) == (1, 10)
    budget.release(a)
    assert accounting(budget, []) == (38, 12, 0)
    assert (budget.cache.protected_size, budget.req_to_token.num_free_rows) == (0, 4)

    budget.admit(b)  # readmitted: 11 of 12 from the cache, not counted as cached again
    assert (b.num_computed_tokens, b.num_cached_tokens) == (11, 10)
    assert stats.num_cached_tokens == 10
    assert budget.available_slots == 38 + 1  # the unlocked 12th token can still be evicted
    assert accounting(budget, [b]) == (38, 12, 0)


def test_allocating_a_pass_evicts_the_cache_on_demand():
    budget = make_budget()
    a = request("a", list(range(100, 112)))
    budget.admit(a)
    run_pass(budget, a)
    budget.release(a)  # all 12 tokens cached, evictable
    assert accounting(budget, []) == (38, 12, 0)
    c = request("c", list(range(200, 245)))  # 45 tokens: 7 more than are free
    budget.admit(c)
    run_pass(budget, c)
    assert accounting(budget, [c]) == (5, 0, 45)
    assert budget.cache.num_evicted_tokens == 12


def admits(budget: KVBudget, req: Request, running: list[Request], num_planned: int) -> bool:
    return budget.can_admit(req, len(running), budget.reserved_need(running), num_planned)


def test_admission_keeps_decode_room_for_the_running():
    config = SchedulerConfig(max_running_requests=4, init_new_token_ratio=0.5)
    budget = make_budget(config=config)
    a = request("a", list(range(100, 120)), max_new=10)  # needs 20 + 0.5 * 10 = 25
    b = request("b", list(range(200, 220)), max_new=12)  # 20 + 6 = 26
    c = request("c", list(range(300, 320)), max_new=10)  # 25
    assert budget.future_need(a) == 25 and budget.future_need(b) == 26
    assert admits(budget, b, [], num_planned=0)  # idle: any free slot will do
    budget.admit(a)
    assert not admits(budget, b, [a], num_planned=20)  # 26 > 50 - 25
    assert admits(budget, c, [a], num_planned=20)  # 25 <= 50 - 25
    run_pass(budget, a)
    a.output_ids.append(7)  # a decodes now: 1 + ceil(0.5 * 9) = 6 more
    assert budget.future_need(a) == 6
    assert not admits(budget, c, [a], num_planned=1)  # 25 > 30 available - 6
    d = request("d", list(range(400, 419)), max_new=10)  # 19 + 5 = 24
    assert admits(budget, d, [a], num_planned=1)
    assert not admits(budget, d, [a, a, a, a], num_planned=1)  # max_running_requests


def test_new_token_ratio_decays_to_the_minimum_and_rises_after_a_retraction():
    config = SchedulerConfig(
        init_new_token_ratio=0.7, min_new_token_ratio=0.1, new_token_ratio_decay_steps=3
    )
    budget = make_budget(config=config)
    seen = []
    for _ in range(4):
        budget.decay_new_token_ratio()
        seen.append(round(budget.new_token_ratio, 6))
    assert seen == [0.5, 0.3, 0.1, 0.1]
    budget.raise_new_token_ratio()
    assert budget.new_token_ratio == pytest.approx(0.55)
    for _ in range(3):
        budget.decay_new_token_ratio()
    assert budget.new_token_ratio == pytest.approx(0.1)  # back over the decay steps


def test_only_so_many_new_tokens_count_towards_the_need():
    budget = make_budget(config=SchedulerConfig(init_new_token_ratio=1.0))
    a = request("a", [5, 6, 7], max_new=100_000)
    assert budget.future_need(a) == 3 + 4096
