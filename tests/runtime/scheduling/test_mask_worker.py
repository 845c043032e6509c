"""MaskWorker: a pass's grammar bitmask, filled beside the pass or before it: the
constrained rows only, complete once waited for, a fill's error raised at the wait, and
the thread gone at close."""

from __future__ import annotations

import threading

import pytest

from radixlm.runtime.scheduling.mask_worker import THREAD_NAME, MaskWorker
from radixlm.runtime.scheduling.stats import SchedulerStats
from tests.runtime.scheduling.helpers import CountingGrammar, Vocab, request


def _mask_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


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
