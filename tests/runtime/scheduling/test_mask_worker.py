"""MaskWorker: a pass's grammar bitmask, filled beside the pass or before it: the
constrained rows only, complete once waited for, a fill's error raised at the wait, and
the threads gone at close. A pool of threads fills contiguous runs of the rows side by
side, and gives the bitmask one thread gives, on real grammars."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from radixlm.runtime.scheduling import mask_worker
from radixlm.runtime.scheduling.mask_worker import THREAD_NAME, MaskWorker
from radixlm.runtime.scheduling.stats import SchedulerStats
from tests.runtime.scheduling.helpers import CountingGrammar, Vocab, request


def _mask_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME)]


@pytest.mark.parametrize("overlap", [True, False])
def test_the_mask_covers_the_constrained_rows_only(overlap: bool) -> None:
    stats = SchedulerStats()
    worker = MaskWorker(Vocab(), stats, overlap)  # type: ignore[arg-type]
    reqs = [request(f"r{i}", [1, 2]) for i in range(3)]
    assert worker.start(reqs) is None  # no grammar: no mask work at all
    reqs[1].grammar = CountingGrammar(5)  # type: ignore[assignment]
    reqs[2].grammar = CountingGrammar(7)  # type: ignore[assignment]
    mask = worker.start(reqs)
    assert mask is not None and mask.rows.tolist() == [1, 2]
    assert (mask.wait is not None) == overlap
    if mask.wait is not None:
        mask.wait()
    assert mask.bitmask.tolist() == [[5, 5], [7, 7]]
    assert list(stats.mask_fill_rows) == [2] and stats.mask_fill_seconds[0] >= 0
    worker.close()


def test_the_fill_runs_beside_the_caller_until_waited_for() -> None:
    """(Other engines of the test session may hold mask threads of their own.)"""
    gate = threading.Event()
    worker = MaskWorker(Vocab(), SchedulerStats(), overlap=True)  # type: ignore[arg-type]
    req = request("r", [1, 2])
    req.grammar = CountingGrammar(3, gate)  # type: ignore[assignment]
    before = set(_mask_threads())
    mask = worker.start([req])
    assert mask is not None and mask.wait is not None
    ours = set(_mask_threads()) - before
    assert len(ours) == 1  # the caller goes on while the fill waits on its thread
    gate.set()
    mask.wait()
    assert mask.bitmask.tolist() == [[3, 3]]
    worker.close()
    assert not ours & set(_mask_threads())


def test_a_failed_fill_raises_at_the_wait_and_the_worker_goes_on() -> None:
    worker = MaskWorker(Vocab(), SchedulerStats(), overlap=True)  # type: ignore[arg-type]
    bad, good = request("bad", [1]), request("good", [1])
    bad.grammar = CountingGrammar(-1)  # type: ignore[assignment]
    good.grammar = CountingGrammar(4)  # type: ignore[assignment]
    failed = worker.start([bad])
    with pytest.raises(RuntimeError, match="grammar engine failed"):
        failed.wait()  # type: ignore[misc, union-attr]
    mask = worker.start([good])
    mask.wait()  # type: ignore[misc, union-attr]
    assert mask.bitmask.tolist() == [[4, 4]]  # type: ignore[union-attr]
    worker.close()


class _ThreadRecordingGrammar:
    """Fills its row with its id once ``barrier`` (one party per pool thread) lets
    every thread through, and records which thread filled it."""

    def __init__(self, ident: int, barrier: threading.Barrier, filled_by: dict) -> None:
        self.ident, self.barrier, self.filled_by = ident, barrier, filled_by

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.barrier.wait(timeout=10)  # breaks (and fails the fill) unless all run at once
        self.filled_by[self.ident] = threading.current_thread().name
        bitmask[row] = self.ident


def test_each_pool_thread_fills_a_contiguous_run_of_the_rows_at_once() -> None:
    worker = MaskWorker(Vocab(), SchedulerStats(), overlap=True, num_threads=4)  # type: ignore[arg-type]
    barrier, filled_by = threading.Barrier(4), {}
    reqs = [request(f"r{i}", [1]) for i in range(8)]
    for i, req in enumerate(reqs):
        req.grammar = _ThreadRecordingGrammar(i, barrier, filled_by)  # type: ignore[assignment]
    mask = worker.start(reqs)
    mask.wait()  # type: ignore[misc, union-attr]
    assert mask.bitmask.tolist() == [[i, i] for i in range(8)]  # type: ignore[union-attr]
    runs = [filled_by[i] for i in range(8)]
    assert set(runs) == {f"{THREAD_NAME}-{k}" for k in range(4)}
    assert all(runs[2 * k] == runs[2 * k + 1] for k in range(4))  # rows 0-1, 2-3, ...
    worker.close()


@pytest.mark.parametrize("bad_row", [0, 7])
def test_a_failed_run_fails_the_wait_once_every_run_is_done(bad_row: int) -> None:
    """The runner may touch the matchers once the wait returns or raises: no run of the
    pass may still be filling then, whichever run failed."""
    worker = MaskWorker(Vocab(), SchedulerStats(), overlap=True, num_threads=4)  # type: ignore[arg-type]
    slow_row = 7 - bad_row
    gate = threading.Event()
    reqs = [request(f"r{i}", [1]) for i in range(8)]
    for i, req in enumerate(reqs):
        req.grammar = CountingGrammar(i + 1)  # type: ignore[assignment]
    reqs[bad_row].grammar = CountingGrammar(-1)  # type: ignore[assignment]
    reqs[slow_row].grammar = CountingGrammar(9, gate)  # type: ignore[assignment]
    mask = worker.start(reqs)
    threading.Timer(0.2, gate.set).start()
    with pytest.raises(RuntimeError, match="grammar engine failed"):
        mask.wait()  # type: ignore[misc, union-attr]
    assert mask.bitmask[slow_row].tolist() == [9, 9]  # type: ignore[union-attr]
    with pytest.raises(RuntimeError, match="grammar engine failed"):
        mask.wait()  # type: ignore[misc, union-attr]  # again at a second wait
    worker.close()


def test_close_stops_every_pool_thread_and_a_later_fill_starts_them_again() -> None:
    worker = MaskWorker(Vocab(), SchedulerStats(), overlap=True, num_threads=3)  # type: ignore[arg-type]
    req = request("r", [1])
    req.grammar = CountingGrammar(5)  # type: ignore[assignment]
    before = set(_mask_threads())
    worker.start([req]).wait()  # type: ignore[misc, union-attr]
    ours = set(_mask_threads()) - before
    assert sorted(t.name for t in ours) == [f"{THREAD_NAME}-{k}" for k in range(3)]
    worker.close()
    assert not any(t.is_alive() for t in ours)
    mask = worker.start([req])
    mask.wait()  # type: ignore[misc, union-attr]
    assert mask.bitmask.tolist() == [[5, 5]]  # type: ignore[union-attr]
    worker.close()
    assert set(_mask_threads()) <= before


def test_a_pool_closed_on_a_hung_fill_leaves_the_next_pool_alone(monkeypatch) -> None:
    """close gives up on a thread whose fill hangs; that thread, and the stop queued for
    it, stay out of the pool the next fill starts."""
    monkeypatch.setattr(mask_worker, "CLOSE_TIMEOUT_S", 0.1)
    worker = MaskWorker(Vocab(), SchedulerStats(), overlap=True)  # type: ignore[arg-type]
    gate = threading.Event()
    hung, req = request("hung", [1]), request("r", [1])
    hung.grammar = CountingGrammar(1, gate)  # type: ignore[assignment]
    req.grammar = CountingGrammar(5)  # type: ignore[assignment]
    before = set(_mask_threads())
    hung_mask = worker.start([hung])
    old = set(_mask_threads()) - before
    worker.close()
    assert all(t.is_alive() for t in old)
    mask = worker.start([req])
    mask.wait()  # type: ignore[misc, union-attr]
    assert mask.bitmask.tolist() == [[5, 5]]  # type: ignore[union-attr]
    gate.set()
    hung_mask.wait()  # type: ignore[misc, union-attr]
    worker.close()
    for thread in old:
        thread.join(timeout=10)
    assert set(_mask_threads()) <= before


def test_pass_stats_count_the_requests_of_all_runs() -> None:
    stats = SchedulerStats()
    worker = MaskWorker(Vocab(), stats, overlap=True, num_threads=2)  # type: ignore[arg-type]
    reqs = [request(f"r{i}", [1]) for i in range(5)]
    for i, req in enumerate(reqs):
        req.grammar = CountingGrammar(i)  # type: ignore[assignment]
    mask = worker.start(reqs)
    mask.wait()  # type: ignore[misc, union-attr]
    mask.wait()  # type: ignore[misc, union-attr]  # the runner may wait twice: one record
    assert list(stats.mask_fill_rows) == [5] and len(stats.mask_fill_seconds) == 1
    worker.close()


def test_threads_must_be_positive() -> None:
    with pytest.raises(ValueError, match="num_threads must be >= 1, got 0"):
        MaskWorker(Vocab(), SchedulerStats(), overlap=True, num_threads=0)  # type: ignore[arg-type]


# ---- real grammars: a pool's bitmask is the one the loop thread fills ----------------

SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "city": {"enum": ["Paris", "Lagos", "Osaka"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "ok": {"type": "boolean"},
        },
        "required": ["city", "tags", "ok"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"price": {"type": "number"}, "sku": {"type": "string"}},
        "required": ["price", "sku"],
        "additionalProperties": False,
    },
]
OUTPUTS = [
    '{"name":"Ada Lovelace","age":36}',
    '{"city":"Osaka","tags":["red","sea"],"ok":true}',
    '{"price":12.5,"sku":"AB-1234-XY"}',
]
NUM_REQUESTS = 9  # three per schema, each at a different point of its output


@pytest.fixture(scope="module")
def grammar_compiler(hf_tokenizer):
    from radixlm.runtime.config import GrammarConfig
    from radixlm.runtime.constrained import GrammarCompiler, TokenVocabulary

    vocab = TokenVocabulary.from_tokenizer(hf_tokenizer, len(hf_tokenizer), frozenset({2}))
    compiler = GrammarCompiler(vocab, GrammarConfig())
    yield compiler
    compiler.close()


def _real_requests(compiler, tokenizer, backend: str) -> tuple[list, list[list[int]]]:
    """Requests whose matchers stand at different points of valid outputs (one without
    a grammar among them), and each one's tokens still to come."""
    from radixlm.runtime.constrained import GrammarSpec

    reqs, ahead = [request("plain", [1])], [[]]
    for i in range(NUM_REQUESTS):
        spec = GrammarSpec("json_schema", json.dumps(SCHEMAS[i % 3]))
        tokens = tokenizer.encode(OUTPUTS[i % 3], add_special_tokens=False)
        req = request(f"r{i}", [1])
        req.grammar = compiler.compile(spec, backend).new_matcher()  # type: ignore[assignment]
        done = i * len(tokens) // (NUM_REQUESTS + 1)
        for token in tokens[:done]:
            assert req.grammar.accept_token(token)  # type: ignore[union-attr]
        reqs.append(req)
        ahead.append(tokens[done:])
    return reqs, ahead


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_rows_split_over_threads_give_the_bitmask_one_thread_gives(
    grammar_compiler, hf_tokenizer, backend: str
) -> None:
    """Over several passes, with and without speculative proposals (a request's K + 1
    rows stay in one run: its matcher walks them and back)."""
    pytest.importorskip(backend)
    reqs, ahead = _real_requests(grammar_compiler, hf_tokenizer, backend)
    vocab = grammar_compiler.vocab
    serial = MaskWorker(vocab, SchedulerStats(), overlap=False)
    pools = [MaskWorker(vocab, SchedulerStats(), overlap=True, num_threads=n) for n in (1, 2, 4)]
    try:
        for step in range(4):
            num_proposed = step % 3  # 0, 1 or 2 proposals each
            proposals = [(5,) * num_proposed] + [tuple(a[:num_proposed]) for a in ahead[1:]]
            expected = serial.start(reqs, proposals)
            assert expected is not None
            for pool in pools:
                mask = pool.start(reqs, proposals)
                mask.wait()  # type: ignore[misc, union-attr]
                assert torch.equal(mask.rows, expected.rows)  # type: ignore[union-attr]
                assert torch.equal(mask.bitmask, expected.bitmask)  # type: ignore[union-attr]
            for req, tokens in zip(reqs, ahead):
                if req.grammar is not None and tokens:
                    assert req.grammar.accept_token(tokens.pop(0))
    finally:
        for pool in pools:
            pool.close()
