"""Chi-square checks shared by the speculative tests (no scipy in the test deps)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence

__all__ = ["assert_same_distribution", "chi_square_critical"]


def chi_square_critical(df: int, z: float = 3.719) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.719: alpha 1e-4)."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * math.sqrt(c)) ** 3


def assert_same_distribution(a: Sequence[Hashable], b: Sequence[Hashable]) -> None:
    """Two-sample chi-square test of homogeneity at alpha 1e-4: ``a`` and ``b`` look
    drawn from one distribution. Outcomes expected fewer than 5 times in either sample
    are pooled into one cell."""
    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    cells = []
    for key in set(ca) | set(cb):
        total = ca[key] + cb[key]
        cells.append((ca[key], cb[key], total * na / (na + nb), total * nb / (na + nb)))
    big = [c for c in cells if min(c[2], c[3]) >= 5]
    small = [c for c in cells if min(c[2], c[3]) < 5]
    if small:
        big.append(tuple(sum(c[i] for c in small) for i in range(4)))  # type: ignore[arg-type]
    stat = sum((oa - ea) ** 2 / ea + (ob - eb) ** 2 / eb for oa, ob, ea, eb in big if ea and eb)
    df = len(big) - 1
    assert df >= 1, "a single outcome: nothing to compare"
    assert stat < chi_square_critical(df), f"chi-square {stat:.1f} on {df} degrees of freedom"
