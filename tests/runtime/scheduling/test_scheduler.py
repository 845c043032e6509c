"""Scheduler unit tests: a fake model (no forward pass) and a fake detokenizer (no
tokenizer) drive schedule/process_output."""

from __future__ import annotations

import pytest

from radixlm.runtime.config import SchedulerConfig
from radixlm.runtime.executor.forward_batch import ModelOutput
from radixlm.runtime.io.messages import TokenizedRequest
from radixlm.runtime.mem_cache.kv_pool import ReqToTokenTable, SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import DisabledCache, RadixCache
from radixlm.runtime.scheduling.batch_builder import WorkItem
from radixlm.runtime.scheduling.scheduler import ScheduledBatch, Scheduler
from tests.runtime.scheduling.helpers import EOS, request, tokenized


def make_scheduler(
    num_slots: int,
    chunk: int,
    max_running: int = 8,
    ratio: float = 0.0,
    radix: bool = False,
    config: SchedulerConfig | None = None,
):
    """``ratio``: the new-token ratio admission keeps decode room by, fixed (0: admit
    eagerly, as the retraction tests need). ``config`` replaces the one built from
    chunk / max_running / ratio (the table still has ``max_running`` rows)."""
    config = config or SchedulerConfig(
        max_running_requests=max_running,
        chunked_prefill_size=chunk,
        init_new_token_ratio=ratio,
        min_new_token_ratio=ratio,
    )
    allocator = SlotAllocator(num_slots + 1)
    cache = (RadixCache if radix else DisabledCache)(allocator.free)
    return Scheduler(config, allocator, ReqToTokenTable(max_running, 512), cache)


def make_request(rid: str, num_prompt: int, max_new: int, min_new: int = 0) -> TokenizedRequest:
    prompt = tuple(300 + (i % 50) for i in range(num_prompt))
    return tokenized(rid, prompt, max_new, min_new)


def fake_step(sched: Scheduler) -> list[int]:
    """One pass with a fake model that samples 400 + len(output); returns pass sizes."""
    batch = sched.schedule()
    assert batch is not None
    tokens = [400 + len(r.output_ids) for r in batch.sampled]
    sched.process_output(batch, ModelOutput(tokens, [], []))
    # Slots conserved: free, kept by the cache, or a running request's own (beyond the
    # cached prefix it locks).
    own = sum(r.num_computed_tokens - sched.cache.prefix_len(r.prefix_node) for r in sched.running)
    total = sched.allocator.num_free + sched.cache.total_size + own
    assert total == sched.allocator.capacity
    assert sched.cache.protected_size <= sum(r.num_computed_tokens for r in sched.running)
    return [w.num_tokens for w in batch.work]


def run_all(sched: Scheduler, max_steps: int = 10_000) -> list[list[int]]:
    passes = []
    while sched.has_work and len(passes) < max_steps:
        passes.append(fake_step(sched))
    assert not sched.has_work
    return passes


def test_long_prompt_is_chunked_and_decodes_join_the_same_pass():
    sched = make_scheduler(num_slots=1000, chunk=16)
    short = make_request("short", 4, 20)
    short = sched.add_request(short)
    fake_step(sched)  # short prefilled, first token sampled
    long = make_request("long", 100, 3)
    long = sched.add_request(long)
    sizes = fake_step(sched)
    assert sizes == [1, 15]  # short's decode token + the rest of the 16-token budget
    while long.num_computed_tokens < 100:
        assert sum(fake_step(sched)) <= 16
    assert long.output_ids == [400]  # sampled exactly when the last chunk ran
    run_all(sched)
    assert len(short.output_ids) == 20 and len(long.output_ids) == 3


def test_a_short_request_starts_in_the_next_pass_of_a_long_prefill():
    sched = make_scheduler(num_slots=1000, chunk=16)
    long = sched.add_request(make_request("long", 200, 2))
    assert fake_step(sched) == [16]
    short = sched.add_request(make_request("short", 4, 3))
    assert fake_step(sched) == [12, 4]  # long's chunk gives way to short's whole prompt
    assert short.output_ids == [400] and long.num_computed_tokens == 28
    queued = [sched.add_request(make_request(f"q{i}", 30, 1)) for i in range(3)]
    # short decodes; of the 15 tokens left, 7 (about half) are held for the queue
    assert fake_step(sched) == [1, 8, 7]
    assert [q.num_computed_tokens for q in queued] == [7, 0, 0]
    run_all(sched)
    assert long.output_ids == [400, 401] and all(q.output_ids == [400] for q in queued)


def test_the_held_share_goes_back_to_running_prefills_when_nobody_can_start():
    sched = make_scheduler(num_slots=1000, chunk=16, max_running=1)
    long = sched.add_request(make_request("long", 100, 1))
    fake_step(sched)
    sched.add_request(make_request("waits", 4, 1))  # max_running_requests=1: cannot start
    assert fake_step(sched) == [16]
    assert long.num_computed_tokens == 32


def test_decode_room_at_admission_spares_a_tight_pool_its_retractions():
    # 8 requests of 40 + 20 tokens in a 130-slot pool: two fit with their decodes.
    def run(ratio: float) -> tuple[int, list[list[int]]]:
        sched = make_scheduler(num_slots=130, chunk=64, ratio=ratio)
        reqs = [sched.add_request(make_request(f"r{i}", 40, 20)) for i in range(8)]
        run_all(sched)
        assert sched.allocator.num_free == sched.allocator.capacity
        return sched.stats.num_retractions, [r.output_ids for r in reqs]

    eager_retractions, eager = run(0.0)
    kept_retractions, kept = run(1.0)
    assert eager == kept == [[400 + i for i in range(20)]] * 8
    assert eager_retractions > 0 and kept_retractions == 0


def test_a_retraction_makes_admission_keep_more_room():
    config = SchedulerConfig(
        chunked_prefill_size=64, init_new_token_ratio=0.0, min_new_token_ratio=0.0
    )
    sched = make_scheduler(num_slots=130, chunk=64, config=config)
    for i in range(8):
        sched.add_request(make_request(f"r{i}", 40, 20))
    while sched.stats.num_retractions == 0:
        fake_step(sched)
    # halfway to 1 (that pass's decay of 0.5 / 600 aside), falling back to 0 after
    assert sched._budget.new_token_ratio == pytest.approx(0.5 - 0.5 / 600)
    run_all(sched)


def test_tiny_pool_retracts_and_still_finishes_everything():
    sched = make_scheduler(num_slots=80, chunk=64)
    reqs = [make_request(f"r{i}", 30, 20) for i in range(6)]
    reqs = [sched.add_request(r) for r in reqs]
    run_all(sched)
    assert sched.stats.num_retractions > 0
    assert all(r.output_ids == [400 + i for i in range(20)] for r in reqs)
    assert all(r.finish_reason.type == "length" for r in reqs)
    assert sched.allocator.num_free == sched.allocator.capacity
    assert sched.req_to_token.num_free_rows == 8


def test_unfinished_prefills_never_starve_each_other():
    # Two 60-token prompts in a 70-slot pool: each fits alone, not together.
    sched = make_scheduler(num_slots=70, chunk=40)
    a = make_request("a", 60, 5)
    b = make_request("b", 60, 5)
    a = sched.add_request(a)
    b = sched.add_request(b)
    run_all(sched, max_steps=200)
    assert len(a.output_ids) == 5 and len(b.output_ids) == 5


def test_abort_frees_waiting_and_running_requests():
    sched = make_scheduler(num_slots=200, chunk=64, max_running=1)
    running = make_request("run", 10, 50)
    waiting = make_request("wait", 10, 50)
    running = sched.add_request(running)
    waiting = sched.add_request(waiting)
    fake_step(sched)
    (chunk,) = sched.abort("wait")
    assert chunk.rid == "wait" and chunk.finish_reason.type == "abort"
    assert waiting.finish_reason.type == "abort"
    assert [c.rid for c in sched.abort("run")] == ["run"] and sched.abort("nope") == []
    assert sched.allocator.num_free == sched.allocator.capacity and not sched.has_work


@pytest.mark.parametrize("stop_at", [0, 3])
def test_min_new_tokens_keeps_a_stop_token_from_ending_early(stop_at):
    sched = make_scheduler(num_slots=200, chunk=64)
    req = sched.add_request(make_request("r", 5, 10, min_new=stop_at))
    fake_step(sched)
    batch = sched.schedule()
    sched.process_output(batch, ModelOutput([EOS], [], []))
    assert req.finished == (stop_at == 0)  # EOS was the 2nd token: allowed only if min is < 2


def test_a_repeated_prompt_is_served_from_the_radix_cache():
    sched = make_scheduler(num_slots=1000, chunk=64, radix=True)
    first = make_request("a", 40, 4)
    first = sched.add_request(first)
    run_all(sched)
    again = make_request("b", 40, 4)
    again = sched.add_request(again)
    sizes = fake_step(sched)
    assert again.num_cached_tokens == 39 and sizes == [1]  # only the last prompt token runs
    run_all(sched)
    assert again.output_ids == first.output_ids
    assert sched.stats.num_cached_tokens == 39


def test_queued_requests_reuse_a_prefix_as_soon_as_it_is_prefilled():
    # 4 requests, same 60-token prompt; a 64-token budget admits one per step.
    sched = make_scheduler(num_slots=1000, chunk=64, radix=True)
    reqs = [make_request(f"r{i}", 60, 3) for i in range(4)]
    reqs = [sched.add_request(r) for r in reqs]
    passes = run_all(sched)
    assert [r.num_cached_tokens for r in reqs] == [0, 59, 59, 59]
    assert sum(map(sum, passes)) == 60 + 3 * 1 + 4 * 2  # prefill once + 1 token each + decodes


def test_tiny_pool_with_sharing_evicts_and_retracts_without_leaks():
    sched = make_scheduler(num_slots=90, chunk=32, radix=True)
    reqs = [make_request(f"r{i}", 20 + 5 * (i % 3), 25) for i in range(9)]
    reqs = [sched.add_request(r) for r in reqs]
    run_all(sched)
    assert all(len(r.output_ids) == 25 for r in reqs)
    assert sched.cache.protected_size == 0
    assert sched.allocator.num_free + sched.cache.total_size == sched.allocator.capacity
    assert sched.cache.num_evicted_tokens > 0


@pytest.mark.parametrize(("policy", "first"), [("lpm", "shares"), ("fcfs", "other")])
def test_policy_decides_who_is_admitted_first(policy, first):
    config = SchedulerConfig(chunked_prefill_size=40, schedule_policy=policy)
    sched = make_scheduler(num_slots=1000, chunk=40, radix=True, config=config)
    shared = list(range(300, 340))
    sched.add_request(tokenized("warm", shared))
    run_all(sched)
    other = tokenized("other", list(range(500, 540)))
    shares = tokenized("shares", shared[:-1] + [999])
    other = sched.add_request(other)
    shares = sched.add_request(shares)
    batch = sched.schedule()
    assert batch.work[0].req.rid == first


def test_lpm_admits_a_starving_request_first():
    config = SchedulerConfig(max_running_requests=1, chunked_prefill_size=40, lpm_max_wait_steps=3)
    sched = make_scheduler(num_slots=1000, chunk=40, max_running=1, radix=True, config=config)
    shared = list(range(300, 340))
    sched.add_request(tokenized("warm", shared))
    run_all(sched)
    sched.add_request(tokenized("blocker", list(range(600, 610)), 10))
    fake_step(sched)  # blocker runs; with one running slot nothing else is admitted
    sched.add_request(tokenized("other", list(range(500, 540))))
    for _ in range(5):
        fake_step(sched)  # "other" waits 5 steps > lpm_max_wait_steps
    sched.add_request(tokenized("shares", shared[:-1] + [7]))
    while sched.running:
        fake_step(sched)
    assert sched.schedule().work[0].req.rid == "other"  # not "shares" and its 39 cached tokens


def test_a_failed_pass_is_undone_and_its_requests_run_alone_until_one_fails_alone():
    sched = make_scheduler(num_slots=200, chunk=64)
    good, bad = (sched.add_request(make_request(rid, 10, 3)) for rid in ("good", "bad"))
    batch = sched.schedule()
    assert [w.req.rid for w in batch.work] == ["good", "bad"]
    assert sched.fail_batch(batch, "boom") == []  # nobody blamed yet: the pass is undone
    assert sched.allocator.num_free == sched.allocator.capacity  # its 20 slots came back
    assert good.num_computed_tokens == 0 and bad.num_computed_tokens == 0
    solo = sched.schedule()
    assert [(w.req.rid, w.num_tokens) for w in solo.work] == [("good", 10)]
    sched.process_output(solo, ModelOutput([400], [], []))
    solo = sched.schedule()
    assert [w.req.rid for w in solo.work] == ["bad"]
    (chunk,) = sched.fail_batch(solo, "boom")  # alone, it fails: only it is aborted
    assert chunk.rid == "bad" and chunk.finish_reason.message == "boom"
    run_all(sched)
    assert good.output_ids == [400, 401, 402] and bad.finish_reason.type == "abort"
    assert sched.allocator.num_free == sched.allocator.capacity


def test_target_tpot_keeps_prompt_chunks_beside_decodes_within_it():
    """Under target_tpot_ms a pass with decodes takes the prompt tokens the fitted pass
    time leaves room for; a pass with none keeps the whole chunk."""
    config = SchedulerConfig(chunked_prefill_size=256, target_tpot_ms=100.0)
    sched = make_scheduler(num_slots=2000, chunk=256, config=config)
    for n in (16, 80, 16, 256, 32, 200, 16, 120):  # 30 ms + 0.8 ms a token: 87 a pass
        sched.observe_pass(pass_of(n), 0.03 + 0.0008 * n)
    first = sched.add_request(make_request("first", 200, 8))
    assert fake_step(sched) == [200]  # nobody decodes: the whole prompt in one pass
    long = sched.add_request(make_request("long", 400, 2))
    assert fake_step(sched) == [1, 86]  # first's decode and 86 prompt tokens
    assert sched.stats.num_paced_passes == 1
    while long.num_computed_tokens < 400:
        sizes = fake_step(sched)
        assert sizes[0] == 1 and sum(sizes) <= 87
    run_all(sched)
    assert first.output_ids == [400 + i for i in range(8)] and long.output_ids == [400, 401]


def test_without_a_target_prompt_chunks_fill_the_pass_beside_decodes():
    sched = make_scheduler(num_slots=2000, chunk=256)
    for n in (16, 80, 16, 256, 32, 200, 16, 120):
        sched.observe_pass(pass_of(n), 0.03 + 0.0008 * n)
    sched.add_request(make_request("first", 200, 8))
    fake_step(sched)
    sched.add_request(make_request("long", 400, 2))
    assert fake_step(sched) == [1, 255]
    assert sched.stats.num_paced_passes == 0


def pass_of(num_tokens: int) -> ScheduledBatch:
    """What ``observe_pass`` reads of a pass: its work's token count."""
    work = (WorkItem(request("r", [1] * num_tokens), 0, num_tokens),)
    return ScheduledBatch(None, work, (), ())  # type: ignore[arg-type]
