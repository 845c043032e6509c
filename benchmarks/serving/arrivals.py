"""When each request is sent, as offsets in seconds from the start of the run."""

from __future__ import annotations

import math
import random

__all__ = ["arrival_offsets"]


def arrival_offsets(num_requests: int, rate: float, seed: int) -> list[float]:
    """Send times of a Poisson process of ``rate`` requests per second: the first at 0,
    then exponential gaps of mean 1 / rate, drawn from ``seed``; ``rate`` inf sends
    every request at 0.

    Raises:
        ValueError: rate not > 0.
    """
    if not rate > 0:
        raise ValueError(f"request rate must be > 0 (inf: all at once), got {rate}")
    if math.isinf(rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    offsets, now = [], 0.0
    for i in range(num_requests):
        if i:
            now += rng.expovariate(rate)
        offsets.append(now)
    return offsets
