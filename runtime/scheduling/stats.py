"""The scheduler's counters and latency histograms, shared by its parts.

Ownership: one ``SchedulerStats`` per ``Scheduler``; the scheduler and the parts
it composes (``KVBudget``, ``BatchBuilder``, ``OutputProcessor``) add to it on
the engine loop thread; the engine only reads it (``get_stats``), through
``Histogram.snapshot`` for the histograms (``radixlm.runtime.histogram``).

The histograms are the engine's own, so every request counts whatever entrypoint
sent it (the HTTP server's ``/metrics`` exports them in Prometheus' format)::

    ttft         created -> first output token      (OutputProcessor)
    inter_token  one output token -> the next       (OutputProcessor)
    e2e          created -> finished                (OutputProcessor)
    queue        created -> first admitted          (Scheduler)

("created": when the caller's request was tokenized and queued.)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from radixlm.runtime.histogram import Histogram, HistogramSnapshot

__all__ = ["LatencyHistograms", "SchedulerStats"]

# Upper bounds in seconds (Prometheus' "le"), the last bucket is +Inf.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
INTER_TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)


@dataclass(frozen=True)
class LatencyHistograms:
    """A snapshot of the engine's request latencies (see the module docstring)."""

    ttft: HistogramSnapshot
    inter_token: HistogramSnapshot
    e2e: HistogramSnapshot
    queue: HistogramSnapshot


@dataclass
class SchedulerStats:
    num_steps: int = 0
    num_steps_ahead: int = 0  # passes scheduled while the one before them ran (overlap)
    num_retractions: int = 0
    num_paced_passes: int = 0  # passes whose prompt tokens target_tpot_ms cut
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    num_generated_tokens: int = 0
    num_finished: int = 0
    num_aborted: int = 0  # finished with an abort (by the caller, a failure, a shutdown)
    num_jump_forward_tokens: int = 0  # output tokens appended by jump-forward, not decoded
    # seconds spent filling grammar bitmasks, one entry per pass that had any (recent ones),
    # and how many constrained rows each of those passes filled
    mask_fill_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
    mask_fill_rows: deque[int] = field(default_factory=lambda: deque(maxlen=4096))
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    inter_token: Histogram = field(default_factory=lambda: Histogram(INTER_TOKEN_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))

    def latencies(self) -> LatencyHistograms:
        return LatencyHistograms(
            self.ttft.snapshot(),
            self.inter_token.snapshot(),
            self.e2e.snapshot(),
            self.queue.snapshot(),
        )
