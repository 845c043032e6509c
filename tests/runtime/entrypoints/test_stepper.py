"""Overlap scheduling: passes built while the one before them is in flight
give the same outputs, finishes, logprobs and cache hits as passes run one at a time.

The real scheduler, KV budget, radix cache, batch builder, model runner and sampler
run around a model whose next token is a fixed function of the input token and its
position: a pass that carried a wrong token (or none) changes every later token.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch

from radixlm.runtime.config import SchedulerConfig
from radixlm.runtime.entrypoints.stepper import Stepper
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.io.messages import LogprobSpec, OutputDelta, TokenizedRequest
from radixlm.runtime.mem_cache.kv_pool import ReqToTokenTable, SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import RadixCache
from radixlm.runtime.sampling.sampler import Sampler
from radixlm.runtime.scheduling.request import Request
from radixlm.runtime.scheduling.scheduler import Scheduler
from tests.runtime.scheduling.helpers import EOS, FakeDetokenizer, tokenized

VOCAB = 97
PREFIX = [(7 * i) % 90 + 5 for i in range(40)]  # shared by several prompts
STOP_ID = 61  # the fake detokenizer's stop string


class NextTokenModel(torch.nn.Module):
    """Logits peak at ``(31 * token + 7 * position) % VOCAB`` (at EOS when that is a
    multiple of 13) over a spread of smaller ones, so sampled rows have choices."""

    def forward(self, input_ids, positions, metadata, rows):
        return torch.stack((input_ids, positions), dim=1)[rows].double()

    def compute_logits(self, hidden):
        token, position = hidden[:, 0].long(), hidden[:, 1].long()
        peak = (31 * token + 7 * position) % VOCAB
        peak = torch.where(peak % 13 == 0, EOS, peak)
        spread = torch.arange(VOCAB, dtype=torch.float32)[None, :] * 0.01
        logits = torch.sin(spread * (token[:, None] + 1)) * 2.0
        return logits.scatter(1, peak[:, None], 6.0)


class NoAttention:
    def prepare(self, inputs):
        return None


class Harness:
    """A scheduler and runner stepped by a ``Stepper``, one at a time or overlapped."""

    def __init__(
        self,
        overlap: bool,
        num_slots: int = 4096,
        ratio: float = 0.7,
        target_tpot_ms: float | None = None,
    ) -> None:
        """``ratio``: the decode room admission keeps (0: admit eagerly, then retract)."""
        max_running = 16
        config = SchedulerConfig(
            max_running_requests=max_running,
            chunked_prefill_size=64,
            init_new_token_ratio=ratio,
            min_new_token_ratio=min(ratio, 0.1),
            target_tpot_ms=target_tpot_ms,
        )
        self.allocator = SlotAllocator(num_slots)
        self.scheduler = Scheduler(
            config,
            self.allocator,
            ReqToTokenTable(max_running, 512),
            RadixCache(self.allocator.free),
        )
        runner = ModelRunner(NextTokenModel(), NoAttention(), Sampler(VOCAB, seed=5))
        self.deltas: dict[str, list[OutputDelta]] = {}
        self.stepper = Stepper(self.scheduler, runner, overlap, self._hear)

    def _hear(self, deltas: list[OutputDelta]) -> None:
        for delta in deltas:
            self.deltas.setdefault(delta.rid, []).append(delta)

    def add(self, t: TokenizedRequest) -> Request:
        return self.scheduler.add_request(t)

    def run(self, max_steps: int = 2000) -> None:
        steps = 0
        while self.scheduler.has_work or self.stepper.in_flight:
            self.stepper.step()
            steps += 1
            assert steps < max_steps
        cache = self.scheduler.cache
        assert self.allocator.num_free + cache.total_size == self.allocator.capacity  # no leak
        assert cache.protected_size == 0


def _request(
    rid: str,
    prompt: list[int],
    max_new: int,
    *,
    min_new: int = 0,
    stop_string: bool = False,
    logprobs: bool = False,
    **sampling,
) -> TokenizedRequest:
    detok = FakeDetokenizer(stop_id=STOP_ID) if stop_string else None
    logprob = LogprobSpec(enabled=True, top_k=3, start_len=2) if logprobs else None
    t = tokenized(rid, prompt, max_new, min_new, logprob=logprob, detokenizer=detok)
    return replace(t, params=replace(t.params, **sampling)) if sampling else t


def _workload() -> list[TokenizedRequest]:
    """Greedy and seeded rows; EOS, a stop string, max_new_tokens and min_new_tokens
    ending them; logprobs; a penalised row (its steps cannot run ahead); shared
    prefixes; one prompt scored only."""
    return [
        _request("greedy-long", [3, 8], 40),
        _request("greedy-short", [5, 9, 14] * 3, 3),
        _request("eos-early", [3, 38], 30),
        _request("min-new", [3, 38], 30, min_new=12),
        _request("stop-string", PREFIX + [3, 18], 40, stop_string=True),
        _request("logprobs", PREFIX + [4, 30], 12, logprobs=True),
        _request("seeded", [6, 21] * 4, 25, temperature=0.9, top_p=0.8, seed=11),
        _request("seeded-min-new", [9, 2, 44], 20, temperature=1.2, seed=3, min_new=15),
        _request("shared-1", PREFIX + [3, 8], 18),
        _request("shared-2", PREFIX + [7, 70], 9),
        _request("scored", PREFIX + [8, 8], 0, logprobs=True),
        _request("penalised", [12, 25] * 2, 14, repetition_penalty=1.4),
    ]


def _outcome(harness: Harness, reqs: list[Request]) -> list[tuple]:
    return [
        (
            r.rid,
            r.output_ids,
            r.finish_reason,
            r.text,
            r.num_cached_tokens,
            r.output_logprobs,
            r.prompt_logprobs,
        )
        for r in reqs
    ]


def _run(overlap: bool, staggered: bool = False, **kwargs) -> tuple[Harness, list[tuple]]:
    harness = Harness(overlap, **kwargs)
    reqs = []
    for t in _workload():
        reqs.append(harness.add(t))
        if staggered:  # arrivals while passes are in flight
            harness.stepper.step()
    harness.run()
    return harness, _outcome(harness, reqs)


def test_overlapped_passes_give_the_outputs_of_passes_one_at_a_time() -> None:
    serial, expected = _run(overlap=False)
    overlapped, seen = _run(overlap=True)
    assert seen == expected
    # the cache holds what serial steps leave: no position a pass computed ahead
    assert overlapped.scheduler.cache.total_size == serial.scheduler.cache.total_size
    stats = overlapped.scheduler.stats
    assert stats.num_steps_ahead > stats.num_steps // 2  # most passes were built ahead
    assert serial.scheduler.stats.num_steps_ahead == 0
    by_rid = {r[0]: r for r in expected}
    assert by_rid["eos-early"][1][-1] == EOS and len(by_rid["eos-early"][1]) == 7
    assert EOS not in by_rid["min-new"][1][:11] and len(by_rid["min-new"][1]) > 7
    assert by_rid["stop-string"][2].matched == "STOP"
    assert by_rid["greedy-long"][2].type == "length"
    assert by_rid["shared-2"][4] == len(PREFIX)  # the shared prefix was cached once
    # what callers heard: the same deltas, in the same order per request
    assert _heard(overlapped) == _heard(serial)


def test_arrivals_while_a_pass_is_in_flight_get_the_same_tokens() -> None:
    _, expected = _run(overlap=False, staggered=True)
    _, seen = _run(overlap=True, staggered=True)
    # cache hits may differ (a prefix in flight is not cached yet), the tokens may not
    assert [(r[0], r[1], r[2]) for r in seen] == [(r[0], r[1], r[2]) for r in expected]


def test_a_tight_pool_retracts_between_overlapped_passes_with_the_same_tokens() -> None:
    def run(overlap: bool) -> tuple[Harness, list[tuple]]:
        harness = Harness(overlap, num_slots=60, ratio=0.0)  # admits eagerly, then retracts
        reqs = [harness.add(_request(f"r{i}", [3 + 5 * i, 8 + i] * 3, 30)) for i in range(10)]
        harness.run()
        return harness, [(r.rid, r.output_ids, r.finish_reason) for r in reqs]

    serial, expected = run(overlap=False)
    overlapped, seen = run(overlap=True)
    assert serial.scheduler.stats.num_retractions == 2
    assert overlapped.scheduler.stats.num_retractions == 2
    assert overlapped.scheduler.stats.num_steps_ahead > 0
    assert seen == expected


@pytest.mark.parametrize("when", [1, 3, 6])
def test_an_abort_while_its_pass_is_in_flight_leaks_nothing(when: int) -> None:
    _, expected = _run(overlap=False)
    harness = Harness(overlap=True)
    reqs = [harness.add(t) for t in _workload()]
    for _ in range(when):
        harness.stepper.step()
    assert harness.stepper.in_flight
    gone = harness.scheduler.abort("greedy-long")
    assert gone and gone[0].finished
    harness.run()  # asserts every slot is free or cached
    outcome = _outcome(harness, reqs)
    assert [r for r in outcome if r[0] != "greedy-long"] == [
        r for r in expected if r[0] != "greedy-long"
    ]
    assert reqs[0].finish_reason is not None and reqs[0].finish_reason.type == "abort"


def test_a_failed_pass_built_ahead_fails_only_its_requests() -> None:
    harness = Harness(overlap=True)
    reqs = [harness.add(t) for t in _workload()[:4]]
    harness.stepper.step()  # the prefills
    runner = harness.stepper.runner
    launch = runner.launch

    def fail_once(batch, previous=None):
        runner.launch = launch
        raise RuntimeError("device lost")

    runner.launch = fail_once
    harness.stepper.step()  # built ahead, fails: its requests then run one by one
    harness.run()
    _, expected = _run(overlap=False)
    assert [(r.rid, r.output_ids) for r in reqs] == [(r[0], r[1]) for r in expected[:4]]


def _heard(harness: Harness) -> dict[str, list[tuple]]:
    return {
        rid: [(d.text, d.num_kept_ids, d.new_ids, d.finish_reason) for d in deltas]
        for rid, deltas in harness.deltas.items()
    }


class SlowModel(NextTokenModel):
    """Each pass takes 3 ms at least."""

    def forward(self, input_ids, positions, metadata, rows):
        time.sleep(0.003)
        return super().forward(input_ids, positions, metadata, rows)


@pytest.mark.parametrize("overlap", [False, True])
def test_each_pass_time_reaches_the_scheduler(overlap: bool, monkeypatch) -> None:
    """What paces prompt chunks (target_tpot_ms): every applied pass, its tokens, and
    a time: one at a time, its own step; overlapped, the time since the results before
    it, which a decoding request waits between tokens. No time counts twice."""
    harness = Harness(overlap, target_tpot_ms=1000.0)
    harness.stepper.runner.model = SlowModel()
    seen: list[tuple[int, float]] = []
    observe = harness.scheduler.observe_pass

    def record(batch, seconds: float) -> None:
        seen.append((sum(w.num_tokens for w in batch.work), seconds))
        observe(batch, seconds)

    monkeypatch.setattr(harness.scheduler, "observe_pass", record)
    started = time.perf_counter()
    for t in _workload():
        harness.add(t)
    harness.run()
    elapsed = time.perf_counter() - started
    assert len(seen) == harness.scheduler.stats.num_steps
    total = sum(s for _, s in seen)
    assert 0.003 * len(seen) <= total <= elapsed
    if not overlap:
        assert all(s >= 0.003 for _, s in seen)
    assert harness.scheduler._plan.pace.fit() is not None
