"""The scheduler's side of speculation: adaptive K, caps, grammar-checked proposals,
and the KV of verify rows (rejected slots freed; a request finishing inside its
accepted proposals keeps no slot), driven through the real Scheduler with a fake model
that 'accepts' a chosen number of proposals."""

from __future__ import annotations

import pytest

from radixlm.runtime.config import SchedulerConfig, SpeculativeConfig
from radixlm.runtime.executor.forward_batch import ModelOutput
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.mem_cache.kv_pool import ReqToTokenTable, SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import DisabledCache, RadixCache
from radixlm.runtime.scheduling.request import Request
from radixlm.runtime.scheduling.scheduler import Scheduler
from radixlm.runtime.speculative.controller import (
    PROBE_INTERVAL,
    Speculator,
    best_num_tokens,
    plan_num_tokens,
)
from tests.runtime.scheduling.helpers import tokenized

PERIOD = [11, 12, 13, 14, 15]
PROMPT = PERIOD * 4  # the n-gram proposer continues the period


def test_best_num_tokens_weighs_expected_tokens_against_cost() -> None:
    assert best_num_tokens(0.9, 4, 0.1) == 4  # 4.10 tokens for 1.4 passes
    assert best_num_tokens(0.5, 8, 0.1) == 2  # 1.75 / 1.2 beats 1.875 / 1.3
    assert best_num_tokens(0.1, 4, 0.1) == 0  # 1.1 tokens for 1.1 passes: not worth it
    assert best_num_tokens(1.0, 6, 0.3) == 6
    assert best_num_tokens(0.2, 4, 0.0) == 4  # free extra tokens: always the most
    assert best_num_tokens(0.9, 0, 0.1) == 0


def test_a_batch_raises_the_bar_for_proposals() -> None:
    """Alone, a row accepted 40% of the time proposes 2; in a pass of eight such rows
    each extra token slows all eight: none is worth it."""
    assert plan_num_tokens([0.4], [4], 0.1) == [2]
    assert plan_num_tokens([0.4] * 8, [4] * 8, 0.1) == [0] * 8
    assert plan_num_tokens([0.5] * 8, [4] * 8, 0.1) == [1] * 8  # 0.5 clears the bar
    assert plan_num_tokens([0.95] * 8, [4] * 8, 0.1) == [4] * 8
    mixed = plan_num_tokens([0.9, 0.2, 0.9, 0.2], [4] * 4, 0.1)
    assert mixed[1] == mixed[3] == 0 and mixed[0] == mixed[2] >= 2
    assert plan_num_tokens([0.9, 0.9], [1, 0], 0.1) == [1, 0]  # caps hold


def _request(params: SamplingParams, prompt=PROMPT, output=()) -> Request:
    req = Request("r", 0, list(prompt), params, frozenset(), None)  # type: ignore[arg-type]
    req.output_ids = list(output)
    return req


def _speculator(**options) -> Speculator:
    config = SpeculativeConfig(speculative="ngram", **options)
    return Speculator(config, DisabledCache(lambda slots: None))


def test_caps_from_the_engine_the_request_and_max_new_tokens() -> None:
    spec = _speculator(speculative_num_tokens=4, speculative_adaptive=False)
    greedy = SamplingParams(temperature=0, max_new_tokens=50)
    req = _request(greedy)
    req.spec = spec.new_state(req.all_ids, greedy)
    assert spec.propose(req, room=100).token_ids == (11, 12, 13, 14)
    assert spec.propose(req, room=2).token_ids == (11, 12)
    asked = SamplingParams(temperature=0, max_new_tokens=50, speculative_num_tokens=2)
    assert spec.new_state(PROMPT, asked).max_tokens == 2
    off = SamplingParams(temperature=0, max_new_tokens=50, speculative_num_tokens=0)
    assert spec.new_state(PROMPT, off) is None
    # 3 tokens left to generate: at most 2 proposals (the target draws the last one)
    short = _request(SamplingParams(temperature=0, max_new_tokens=5), output=[11, 12])
    short.spec = spec.new_state(short.all_ids, short.params)
    assert spec.propose(short, room=100).token_ids == (13, 14)


def test_adaptive_k_turns_off_and_probes() -> None:
    spec = _speculator(speculative_num_tokens=4, speculative_token_cost=0.1)
    params = SamplingParams(temperature=0, max_new_tokens=500)
    req = _request(params)
    req.spec = spec.new_state(req.all_ids, params)
    first = spec.propose(req, room=100)
    assert first.num_tokens == 2  # the prior a = 0.5: k = 2 (1.75 / 1.2)
    for _ in range(12):  # every proposal rejected at once
        spec.record(req, first, 0)
    sizes = [spec.propose(req, room=100).num_tokens for _ in range(2 * PROBE_INTERVAL)]
    assert sizes.count(1) == 2 and set(sizes) == {0, 1}  # off, but probing
    assert sizes.index(1) == PROBE_INTERVAL - 1
    probe = spec.propose(req, room=100)
    while not probe.num_tokens:  # the next probe
        probe = spec.propose(req, room=100)
    for _ in range(8):  # the text turned repetitive: everything accepted
        spec.record(req, probe, probe.num_tokens)
        probe = spec.propose(req, room=100)
    assert probe.num_tokens == 4
    stats = spec.stats
    assert stats.verify_rows == 20 and stats.num_accepted == sum(
        n * count for n, count in enumerate(stats.accept_lengths)
    )


class FakeMatcher:
    """Allows tokens below ``limit``; terminal after ``end``; forced text after ``force``."""

    def __init__(self, limit: int, end: int | None = None, force: int | None = None) -> None:
        self.limit, self.end, self.force = limit, end, force
        self.accepted: list[int] = []

    def accept_token(self, token: int) -> bool:
        if token >= self.limit:
            return False
        self.accepted.append(token)
        return True

    def rollback(self, n: int) -> None:
        del self.accepted[len(self.accepted) - n :]

    def is_terminal(self) -> bool:
        return bool(self.accepted) and self.accepted[-1] == self.end

    def forced_string(self) -> str:
        return "}" if self.accepted and self.accepted[-1] == self.force else ""

    def fill_bitmask(self, bitmask, row) -> None:  # pragma: no cover - not used here
        raise AssertionError


@pytest.mark.parametrize(
    ("matcher", "jump", "want"),
    [
        (FakeMatcher(limit=100), False, (11, 12, 13, 14)),
        (FakeMatcher(limit=13), False, (11, 12)),  # 13 is forbidden: cut before it
        (FakeMatcher(limit=100, end=12), False, (11, 12)),  # 12 completes the grammar
        (FakeMatcher(limit=100, force=13), True, (11, 12, 13)),  # jump-forward after 13
        (FakeMatcher(limit=100, force=13), False, (11, 12, 13, 14)),
        (FakeMatcher(limit=11), False, ()),
    ],
)
def test_grammar_cuts_the_proposal(matcher: FakeMatcher, jump: bool, want: tuple) -> None:
    spec = _speculator(speculative_num_tokens=4, speculative_adaptive=False)
    params = SamplingParams(temperature=0, max_new_tokens=50)
    req = _request(params)
    req.grammar, req.jump_forward = matcher, jump  # type: ignore[assignment]
    req.spec = spec.new_state(req.all_ids, params)
    assert spec.propose(req, room=100).token_ids == want
    assert matcher.accepted == []  # walked, then rolled back


class FakeJump:
    """Says the grammar forces the text of ``tokens`` next."""

    def __init__(self, tokens: tuple[int, ...]) -> None:
        self.tokens = tokens

    def forced_tokens(self, matcher, last_token: int) -> tuple[int, ...]:
        return self.tokens


@pytest.mark.parametrize(
    ("forced", "want"),
    [
        ((11, 12), (11, 12, 13, 14)),  # forced, then the history continued after them
        ((20, 21), (20, 21)),  # nothing in the history follows 20 21
        ((11, 12, 13, 14, 15, 11), (11, 12, 13, 14)),  # never more than K
    ],
)
def test_forced_text_is_proposed_first(forced: tuple, want: tuple) -> None:
    config = SpeculativeConfig(
        speculative="ngram", speculative_num_tokens=4, speculative_adaptive=False
    )
    spec = Speculator(config, DisabledCache(lambda slots: None), jump=FakeJump(forced))
    params = SamplingParams(temperature=0, max_new_tokens=50)
    req = _request(params)
    req.grammar = FakeMatcher(limit=100)  # type: ignore[assignment]
    req.spec = spec.new_state(req.all_ids, params)
    proposal = spec.propose(req, room=100)
    assert proposal.token_ids == want and proposal.source.value == "grammar"
    assert req.spec.index.token_ids == PROMPT  # looked up as if appended, then undone


# ---- through the scheduler: the KV of verify rows ------------------------------------------


def _scheduler(num_slots: int, radix: bool = False, k: int = 4) -> Scheduler:
    allocator = SlotAllocator(num_slots + 1)
    cache = (RadixCache if radix else DisabledCache)(allocator.free)
    speculative = SpeculativeConfig(
        speculative="ngram", speculative_num_tokens=k, speculative_adaptive=False
    )
    config = SchedulerConfig(
        chunked_prefill_size=256, init_new_token_ratio=0.0, min_new_token_ratio=0.0
    )
    return Scheduler(config, allocator, ReqToTokenTable(4, 256), cache, speculative=speculative)


def _own_slots(sched: Scheduler) -> int:
    return sum(r.num_computed_tokens - sched.cache.prefix_len(r.prefix_node) for r in sched.running)


def _step(sched: Scheduler, num_accepted: int, after: int) -> None:
    """One pass; each verify row accepts its first ``num_accepted`` proposals and the
    'model' then emits ``after``."""
    batch = sched.schedule()
    assert batch is not None
    proposals = batch.forward.proposals or tuple(() for _ in batch.sampled)
    accepted = [list(p[:num_accepted]) for p in proposals]
    output = ModelOutput([after] * len(batch.sampled), [], [], accepted_ids=accepted)
    sched.process_output(batch, output)
    total = sched.allocator.num_free + sched.cache.total_size + _own_slots(sched)
    assert total == sched.allocator.capacity  # every slot accounted for


def test_rejected_slots_are_freed_and_accepted_kv_kept() -> None:
    sched = _scheduler(num_slots=200)
    req = sched.add_request(tokenized("a", PROMPT, max_new=40))
    _step(sched, 0, 11)  # prefill; samples 11 (continuing the period)
    assert req.output_ids == [11] and req.num_computed_tokens == len(PROMPT)
    batch = sched.schedule()
    assert batch is not None and batch.forward.proposals == ((12, 13, 14, 15),)
    assert batch.work[0].num_tokens == 5
    assert batch.forward.sample_indices.tolist() == [0, 1, 2, 3, 4]
    free_before = sched.allocator.num_free
    output = ModelOutput([99], [], [], accepted_ids=[[12, 13]])
    sched.process_output(batch, output)
    assert req.output_ids == [11, 12, 13, 99]
    assert req.num_computed_tokens == len(PROMPT) + 3  # 11, 12, 13 computed; 99 pending
    assert sched.allocator.num_free == free_before + 2  # the 2 rejected proposals' slots
    assert sched.stats.num_generated_tokens == 4


def test_finishing_inside_accepted_proposals_keeps_no_slot() -> None:
    sched = _scheduler(num_slots=200)
    req = sched.add_request(tokenized("a", PROMPT, max_new=3))  # 3 new tokens at most
    _step(sched, 0, 11)
    batch = sched.schedule()
    assert batch is not None and batch.forward.proposals == ((12,),)  # capped by max_new
    sched.process_output(batch, ModelOutput([13], [], [], accepted_ids=[[12]]))
    assert req.finished and req.output_ids == [11, 12, 13]
    assert sched.allocator.num_free == sched.allocator.capacity  # nothing cached, all free


def test_stop_token_inside_the_accepted_run() -> None:
    sched = _scheduler(num_slots=200, radix=True)
    period = [11, 12, 2, 14, 15]  # 2 is EOS: accepting it ends the request there
    req = sched.add_request(tokenized("a", period * 4, max_new=40))
    _step(sched, 0, 11)
    batch = sched.schedule()
    assert batch is not None and batch.forward.proposals == ((12, 2, 14, 15),)
    sched.process_output(batch, ModelOutput([7], [], [], accepted_ids=[[12, 2, 14]]))
    assert req.finished and req.output_ids == [11, 12, 2]
    assert req.finish_reason.type == "stop"
    # its KV went to the cache up to the EOS, the rest of the pass's slots were freed
    assert sched.allocator.num_free + sched.cache.total_size == sched.allocator.capacity
    assert sched.cache.total_size == len(period) * 4 + 3


def test_speculation_shrinks_before_anything_retracts() -> None:
    """Four decoding requests in a pool with 2 slots to spare: proposals take only
    what is left after every decode has its slot; nobody is retracted."""
    sched = _scheduler(num_slots=4 * (len(PROMPT) + 1) + 2)
    for rid in "abcd":
        sched.add_request(tokenized(rid, PROMPT, max_new=10))
    _step(sched, 0, 11)  # all four prefill; each samples 11
    spare = sched.allocator.num_free + sched.cache.evictable_size - 4
    assert 0 < spare < 4
    batch = sched.schedule()
    assert batch is not None
    assert sum(len(p) for p in batch.forward.proposals) == spare  # what the pool had left
    assert sched.stats.num_retractions == 0
