"""Filling a pass's grammar bitmask while the model computes the pass.

A constrained row's allowed tokens depend only on its matcher, which the scheduler
advanced when it applied the previous pass's tokens; nothing reads or moves a matcher
between the end of ``Scheduler.schedule`` and the sampling of the pass (the runner
waits for the fill before it samples, and before it returns when the pass fails). So
the fill runs beside the forward pass, on a pool of threads of its own, each thread
filling one contiguous run of the (G, W) bitmask's rows::

    loop thread:    schedule ─┬─ forward (the model) ──────────── wait ─ sample ─ apply
    radixlm-mask-0:           ├─ fill rows [0, G/N) ───────────┤
    ...                       │                                │
    radixlm-mask-N-1:         └─ fill rows [(N-1)G/N, G) ──────┘

A request's rows (one, or K + 1 with speculative proposals) stay in one run: its
matcher walks over its proposals and back. Each request has a matcher of its own (the
compiled grammar behind it is shared, read-only), so runs fill side by side.

Whether a pool pays depends on the backend (a debugger saw which fill calls release
the GIL; ``benchmarks/bench_mask_fill.py`` times them: benchmarks/README.md,
"Constrained decoding"):

- llguidance releases the GIL while it computes a mask, which takes long enough per row
  for 2 threads to fill a pass's rows in well under the time of one;
- xgrammar releases it too, but its masks are quick and most of their time is under the
  GIL (its Python wrapper and the tensor's hand-over), so a pool adds only its hand-off;
- outlines-core holds the GIL while it fills (a pool only takes turns).

The pool needs free cores: beside an OpenMP team that spins after a torch op, 2 threads
fill no faster than one. On a CPU the model's team holds every core while
the masks fill, so the engine keeps one thread there (``SchedulerConfig.
grammar_mask_threads``); on a GPU the fill (CPU work) hides behind the forward, and the
host's cores are free for the pool. Fill threads run only the grammar engines' code and
per-row tensor views (no torch op big enough to start a team of their own).
``overlap=False`` fills every row in the loop thread, before the pass.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NamedTuple

import torch

from radixlm.runtime.constrained import GrammarMatcher, TokenVocabulary
from radixlm.runtime.scheduling.request import Request
from radixlm.runtime.scheduling.stats import SchedulerStats

__all__ = ["GrammarMask", "MaskWorker", "THREAD_NAME"]

THREAD_NAME = "radixlm-mask"  # the prefix of every fill thread's name ("radixlm-mask-0")
CLOSE_TIMEOUT_S = 30.0  # the longest ``close`` waits for the threads (a fill may hang)


@dataclass(frozen=True)
class GrammarMask:
    """rows: (G,) sampling rows with a grammar; bitmask: (G, W) their allowed tokens,
    complete once ``wait`` returns (None: filled already)."""

    rows: torch.Tensor
    bitmask: torch.Tensor
    wait: Callable[[], None] | None = None


class _RowFill(NamedTuple):
    """One request's share of the mask: bitmask rows [row, row + 1 + len(proposal))."""

    matcher: GrammarMatcher
    proposal: tuple[int, ...]
    row: int


class MaskWorker:
    """Fills the grammar bitmask of each pass; see the module doc.

    Args:
        vocab: sizes the bitmask (None: no request may carry a grammar).
        stats: each pass's fill time and constrained requests are appended to it.
        overlap: fill beside the pass on the pool (else in the caller, before it).
        num_threads: the pool's threads, started with the first fill, stopped by
            ``close``.
    """

    def __init__(
        self,
        vocab: TokenVocabulary | None,
        stats: SchedulerStats,
        overlap: bool,
        num_threads: int = 1,
    ) -> None:
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        self._vocab = vocab
        self._stats = stats
        self._overlap = overlap
        self._num_threads = num_threads
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []  # serving ``self._jobs``

    def start(
        self, sampled: Sequence[Request], proposals: Sequence[tuple[int, ...]] | None = None
    ) -> GrammarMask | None:
        """The mask of the sampling rows that carry a grammar, its fill started; None
        when none does (then no mask work at all).

        ``proposals`` (speculative decoding): each row's proposed tokens, which its
        grammar allows (checked when proposed). A row then has one logits row per
        position, K + 1 in all, and each gets the mask after the proposals before it:
        the fill walks the matcher over them and rolls it back."""
        if proposals is None:
            proposals = [()] * len(sampled)
        rows: list[int] = []
        fills: list[_RowFill] = []
        offset = 0
        for req, proposal in zip(sampled, proposals):
            if req.grammar is not None:
                fills.append(_RowFill(req.grammar, proposal, len(rows)))
                rows.extend(range(offset, offset + len(proposal) + 1))
            offset += len(proposal) + 1
        if not rows:
            return None
        assert self._vocab is not None, "a request carries a grammar without a vocabulary"
        bitmask = torch.empty(len(rows), self._vocab.bitmask_width, dtype=torch.int32)
        index = torch.tensor(rows, dtype=torch.int64)
        if not self._overlap:
            start, end = _fill(bitmask, fills)
            self._record(end - start, len(fills))
            return GrammarMask(index, bitmask)
        self._ensure_threads()
        chunks = _split(fills, len(rows), self._num_threads)
        futures = [self._submit(bitmask, chunk) for chunk in chunks]
        return GrammarMask(index, bitmask, _PendingFill(futures, len(fills), self._record).wait)

    def close(self) -> None:
        """Stops the fill threads (after the fills queued before), waiting for them up
        to ``CLOSE_TIMEOUT_S`` in all."""
        threads, self._threads = self._threads, []
        for _ in threads:
            self._jobs.put(None)
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _submit(self, bitmask: torch.Tensor, fills: list[_RowFill]) -> Future[tuple[float, float]]:
        done: Future[tuple[float, float]] = Future()
        self._jobs.put(lambda: _settle(done, bitmask, fills))
        return done

    def _record(self, seconds: float, num_requests: int) -> None:
        self._stats.mask_fill_seconds.append(seconds)
        self._stats.mask_fill_rows.append(num_requests)

    def _ensure_threads(self) -> None:
        if self._threads:  # a thread ends only at close, which empties the list
            return
        # a queue per pool: a thread of a closed pool still busy with a fill cannot
        # take the new pool's jobs, nor a new thread its stop
        self._jobs = jobs = queue.SimpleQueue()
        for i in range(self._num_threads):
            name = f"{THREAD_NAME}-{i}"
            thread = threading.Thread(target=_serve, args=(jobs,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)


class _PendingFill:
    """The runs of one pass's fill on the pool; ``wait`` is the mask's."""

    def __init__(
        self,
        futures: list[Future[tuple[float, float]]],
        num_requests: int,
        record: Callable[[float, int], None],
    ) -> None:
        self._futures = futures
        self._num_requests = num_requests
        self._record: Callable[[float, int], None] | None = record

    def wait(self) -> None:
        """Returns once every run is done (the matchers are the scheduler's again);
        raises the first failed run's error (again at each call)."""
        errors = [f.exception() for f in self._futures]  # waits for every run
        for error in errors:
            if error is not None:
                raise error
        if self._record is not None:  # once: the runner may wait more than once
            spans = [f.result() for f in self._futures]
            self._record(max(e for _, e in spans) - min(s for s, _ in spans), self._num_requests)
            self._record = None


def _serve(jobs: queue.SimpleQueue[Callable[[], None] | None]) -> None:
    while (job := jobs.get()) is not None:
        job()


def _split(fills: list[_RowFill], num_rows: int, num_chunks: int) -> list[list[_RowFill]]:
    """``fills`` cut into at most ``num_chunks`` contiguous runs of about equal rows (a
    request's rows never split)."""
    chunks: list[list[_RowFill]] = [[] for _ in range(num_chunks)]
    for fill in fills:
        chunks[fill.row * num_chunks // num_rows].append(fill)
    return [chunk for chunk in chunks if chunk]


def _fill(bitmask: torch.Tensor, fills: list[_RowFill]) -> tuple[float, float]:
    """Fills the rows of ``fills``; returns when it started and ended (perf_counter)."""
    start = time.perf_counter()
    for matcher, proposal, row in fills:
        walked = 0  # the matcher ends as it started, whatever happens
        try:
            for token in proposal:
                matcher.fill_bitmask(bitmask, row + walked)
                if not matcher.accept_token(token):
                    raise RuntimeError(f"proposed token {token} left the grammar")
                walked += 1
            matcher.fill_bitmask(bitmask, row + walked)
        finally:
            if walked:
                matcher.rollback(walked)
    return start, time.perf_counter()


def _settle(
    done: Future[tuple[float, float]], bitmask: torch.Tensor, fills: list[_RowFill]
) -> None:
    try:
        span = _fill(bitmask, fills)
    except BaseException as exc:  # handed to the waiting runner, which fails the pass
        done.set_exception(exc)
    else:
        done.set_result(span)
