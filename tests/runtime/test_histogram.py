"""Histogram: observations land in Prometheus' "le" buckets; snapshots are copies."""

from __future__ import annotations

import pytest

from radixlm.runtime.histogram import Histogram


def test_observations_land_in_le_buckets_and_cumulate():
    h = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 1.0, 3.0):
        h.observe(value)
    snap = h.snapshot()
    assert snap.counts == (2, 2, 1) and snap.count == 5
    assert snap.total == pytest.approx(4.65)
    assert snap.cumulative() == [(0.1, 2), (1.0, 4), (float("inf"), 5)]
    h.observe(0.2)
    assert snap.counts == (2, 2, 1)  # a snapshot does not move
    assert h.snapshot().counts == (2, 3, 1)


def test_bounds_must_increase():
    with pytest.raises(ValueError, match="strictly increasing"):
        Histogram((1.0, 0.5))
