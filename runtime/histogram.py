"""Latency histograms with fixed buckets: the engine observes, exporters read copies.

A ``Histogram`` is written by one thread (the engine loop, or a compile under its
lock) and read through ``snapshot``, an immutable copy in Prometheus' terms
(bucket upper bounds, ``le``; the last bucket is +Inf).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

__all__ = ["Histogram", "HistogramSnapshot"]


@dataclass(frozen=True)
class HistogramSnapshot:
    """bounds: bucket upper bounds (ascending); counts: observations per bucket, one
    more than ``bounds`` (the last is above every bound); total: their sum."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it), +Inf last: Prometheus' buckets."""
        running, out = 0, []
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


class Histogram:
    """Observations in fixed buckets; written by one thread, read by copying."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"bucket bounds must be strictly increasing, got {bounds}")
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._total = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self.bounds, value)] += 1
        self._total += value

    def snapshot(self) -> HistogramSnapshot:
        return HistogramSnapshot(self.bounds, tuple(self._counts), self._total)
