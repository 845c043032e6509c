"""Filling a pass's grammar bitmask while the model computes the pass.

A constrained row's allowed tokens depend only on its matcher, which the scheduler
advanced when it applied the previous pass's tokens; nothing reads or moves a matcher
between the end of ``Scheduler.schedule`` and the sampling of the pass (the runner
waits for the fill before it samples, and before it returns when the pass fails). So
the fill runs beside the forward pass, on a thread of its own::

    loop thread:  schedule ─┬─ forward (the model) ─────── wait ─ sample ─ apply tokens
    mask thread:            └─ fill the bitmask ─────────┘

On a GPU the fill (CPU work) hides behind the forward; on a CPU the two share the cores,
and the fill thread runs only the grammar engines' own code (no torch op, so no OpenMP
team of its own). ``overlap=False`` fills in the loop thread, as before the pass.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from radixlm.runtime.constrained import TokenVocabulary
from radixlm.runtime.scheduling.request import Request
from radixlm.runtime.scheduling.stats import SchedulerStats

__all__ = ["GrammarMask", "MaskWorker", "THREAD_NAME"]

THREAD_NAME = "radixlm-mask"


@dataclass(frozen=True)
class GrammarMask:
    """rows: (G,) sampling rows with a grammar; bitmask: (G, W) their allowed tokens,
    complete once ``wait`` returns (None: filled already)."""

    rows: torch.Tensor
    bitmask: torch.Tensor
    wait: Callable[[], None] | None = None


class MaskWorker:
    """Fills the grammar bitmask of each pass; see the module doc."""

    def __init__(self, vocab: TokenVocabulary | None, stats: SchedulerStats, overlap: bool) -> None:
        self._vocab = vocab
        self._stats = stats
        self._overlap = overlap
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

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
        jobs = []
        offset = 0
        for req, proposal in zip(sampled, proposals):
            if req.grammar is not None:
                rows.extend(range(offset, offset + len(proposal) + 1))
                jobs.append((req.grammar, proposal))
            offset += len(proposal) + 1
        if not rows:
            return None
        assert self._vocab is not None, "a request carries a grammar without a vocabulary"
        bitmask = torch.empty(len(rows), self._vocab.bitmask_width, dtype=torch.int32)
        index = torch.tensor(rows, dtype=torch.int64)

        def fill() -> None:
            start = time.perf_counter()
            k = 0
            for matcher, proposal in jobs:
                walked = 0  # the matcher ends as it started, whatever happens
                try:
                    for token in proposal:
                        matcher.fill_bitmask(bitmask, k)
                        k += 1
                        if not matcher.accept_token(token):
                            raise RuntimeError(f"proposed token {token} left the grammar")
                        walked += 1
                    matcher.fill_bitmask(bitmask, k)
                    k += 1
                finally:
                    if walked:
                        matcher.rollback(walked)
            self._stats.mask_fill_seconds.append(time.perf_counter() - start)
            self._stats.mask_fill_rows.append(len(jobs))

        if not self._overlap:
            fill()
            return GrammarMask(index, bitmask)
        done: Future[None] = Future()
        self._jobs.put(lambda: _settle(done, fill))
        self._ensure_thread()
        return GrammarMask(index, bitmask, done.result)

    def close(self) -> None:
        """Stops the fill thread (after the fills queued before)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join(timeout=30)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()


def _settle(done: Future[None], fill: Callable[[], None]) -> None:
    try:
        fill()
    except BaseException as exc:  # handed to the waiting runner, which fails the pass
        done.set_exception(exc)
    else:
        done.set_result(None)
