"""Scheduler unit tests: a fake model (no forward pass) drives schedule/process_output."""

from __future__ import annotations

import pytest

from radixlm.runtime.batch import ModelOutput
from radixlm.runtime.config import SchedulerConfig
from radixlm.runtime.detokenizer import IncrementalDetokenizer
from radixlm.runtime.kv_pool import ReqToTokenTable, SlotAllocator
from radixlm.runtime.request import Request
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.scheduler import Scheduler

EOS = 2


def make_scheduler(num_slots: int, chunk: int, max_running: int = 8, reserve: int = 1):
    config = SchedulerConfig(
        max_running_requests=max_running, chunked_prefill_size=chunk, retract_decode_steps=reserve
    )
    return Scheduler(config, SlotAllocator(num_slots + 1), ReqToTokenTable(max_running, 512))


def make_request(tokenizer, rid: str, num_prompt: int, max_new: int) -> Request:
    params = SamplingParams(temperature=0, max_new_tokens=max_new)
    prompt = [300 + (i % 50) for i in range(num_prompt)]
    detok = IncrementalDetokenizer(tokenizer, prompt, True, True)
    return Request(rid, prompt, params, frozenset({EOS}), detok)


def fake_step(sched: Scheduler) -> list[int]:
    """One pass with a fake model that samples 400 + len(output); returns pass sizes."""
    batch = sched.schedule()
    assert batch is not None
    tokens = [400 + len(r.output_ids) for r in batch.sampled]
    sched.process_output(batch, ModelOutput(tokens, [], []))
    used = sum(r.num_computed_tokens for r in sched.running)
    assert sched.allocator.num_free + used == sched.allocator.capacity  # slots conserved
    return [w.num_tokens for w in batch.work]


def run_all(sched: Scheduler, max_steps: int = 10_000) -> list[list[int]]:
    passes = []
    while sched.has_work and len(passes) < max_steps:
        passes.append(fake_step(sched))
    assert not sched.has_work
    return passes


def test_long_prompt_is_chunked_and_decodes_join_the_same_pass(hf_tokenizer):
    sched = make_scheduler(num_slots=1000, chunk=16)
    short = make_request(hf_tokenizer, "short", 4, 20)
    sched.add_request(short)
    fake_step(sched)  # short prefilled, first token sampled
    long = make_request(hf_tokenizer, "long", 100, 3)
    sched.add_request(long)
    sizes = fake_step(sched)
    assert sizes == [1, 16]  # short's decode token + a 16-token chunk of long's prompt
    while long.num_computed_tokens < 100:
        assert sum(fake_step(sched)[1:]) <= 16
    assert long.output_ids == [400]  # sampled exactly when the last chunk ran
    run_all(sched)
    assert len(short.output_ids) == 20 and len(long.output_ids) == 3


def test_tiny_pool_retracts_and_still_finishes_everything(hf_tokenizer):
    sched = make_scheduler(num_slots=80, chunk=64)
    reqs = [make_request(hf_tokenizer, f"r{i}", 30, 20) for i in range(6)]
    for r in reqs:
        sched.add_request(r)
    run_all(sched)
    assert sched.stats.num_retractions > 0
    assert all(r.output_ids == [400 + i for i in range(20)] for r in reqs)
    assert all(r.finish_reason.type == "length" for r in reqs)
    assert sched.allocator.num_free == sched.allocator.capacity
    assert sched.req_to_token.num_free_rows == 8


def test_unfinished_prefills_never_starve_each_other(hf_tokenizer):
    # Two 60-token prompts in a 70-slot pool: each fits alone, not together.
    sched = make_scheduler(num_slots=70, chunk=40, reserve=0)
    a = make_request(hf_tokenizer, "a", 60, 5)
    b = make_request(hf_tokenizer, "b", 60, 5)
    sched.add_request(a)
    sched.add_request(b)
    run_all(sched, max_steps=200)
    assert len(a.output_ids) == 5 and len(b.output_ids) == 5


def test_abort_frees_waiting_and_running_requests(hf_tokenizer):
    sched = make_scheduler(num_slots=200, chunk=64, max_running=1)
    running = make_request(hf_tokenizer, "run", 10, 50)
    waiting = make_request(hf_tokenizer, "wait", 10, 50)
    sched.add_request(running)
    sched.add_request(waiting)
    fake_step(sched)
    assert sched.abort("wait") is waiting and waiting.finish_reason.type == "abort"
    assert sched.abort("run") is running and sched.abort("nope") is None
    assert sched.allocator.num_free == sched.allocator.capacity and not sched.has_work


@pytest.mark.parametrize("stop_at", [0, 3])
def test_min_new_tokens_keeps_a_stop_token_from_ending_early(hf_tokenizer, stop_at):
    sched = make_scheduler(num_slots=200, chunk=64)
    req = make_request(hf_tokenizer, "r", 5, 10)
    req.params = SamplingParams(temperature=0, max_new_tokens=10, min_new_tokens=stop_at)
    sched.add_request(req)
    fake_step(sched)
    batch = sched.schedule()
    sched.process_output(batch, ModelOutput([EOS], [], []))
    assert req.finished == (stop_at == 0)  # EOS was the 2nd token: allowed only if min is < 2
