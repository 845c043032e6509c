"""The stream worker: expressions run in order on its thread, the first failure is
kept and skips the rest (still settled), sync and end."""

from __future__ import annotations

import threading

import pytest

from radixlm.ir import Text
from radixlm.stream_worker import StreamWorker


class Recorder:
    def __init__(self, fail_on: str | None = None) -> None:
        self.ran: list[str] = []
        self.settled: list[str] = []
        self.finished = 0
        self.threads: set[str] = set()
        self.fail_on = fail_on

    def execute(self, expr: Text) -> None:
        self.threads.add(threading.current_thread().name)
        if expr.value == self.fail_on:
            raise ValueError(f"no {expr.value}")
        self.ran.append(expr.value)

    def settle(self, expr: Text) -> None:
        self.settled.append(expr.value)

    def finish(self) -> None:
        self.finished += 1

    def worker(self) -> StreamWorker:
        return StreamWorker(self.execute, self.settle, self.finish)


def test_expressions_run_in_order_on_the_worker_thread():
    rec = Recorder()
    worker = rec.worker()
    accepted: list[str] = []
    for value in "abc":
        worker.submit(Text(value), accepted=lambda v=value: accepted.append(v))
    worker.sync()
    assert rec.ran == ["a", "b", "c"] == rec.settled and accepted == ["a", "b", "c"]
    assert rec.threads == {"radixlm-program"}
    worker.end()
    worker.join()
    assert rec.finished == 1 and worker.error is None


def test_the_first_failure_is_kept_and_later_expressions_skip_but_settle():
    rec = Recorder(fail_on="b")
    worker = rec.worker()
    for value in "abc":
        worker.submit(Text(value))
    worker.end()
    worker.join()
    assert rec.ran == ["a"] and rec.settled == ["a", "b", "c"]
    assert isinstance(worker.error, ValueError) and str(worker.error) == "no b"


def test_after_end_submit_raises_and_sync_returns():
    rec = Recorder()
    worker = rec.worker()
    worker.end()
    worker.end()  # twice is fine
    accepted: list[int] = []
    with pytest.raises(RuntimeError, match="has ended"):
        worker.submit(Text("late"), accepted=lambda: accepted.append(1))
    assert accepted == []  # refused before its variables were expected
    worker.join()
    worker.sync()
    assert rec.finished == 1 and rec.ran == []
