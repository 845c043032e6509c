"""From per-request results to a run's figures, as load generators for LLM servers
define them (SGLang's bench_serving, vLLM's benchmark_serving):

    TTFT   send -> first chunk carrying text
    ITL    gaps between successive chunks carrying text (pooled over requests)
    TPOT   (E2E - TTFT) / (output tokens - 1): the mean decode time per token after the first
    E2E    send -> last byte of the stream
    throughput  completed requests, prompt and output tokens per second of the run's
                duration (first send -> last completion)
    goodput     completed requests per second that met every SLO given

Percentiles interpolate linearly between ranks (numpy's default method).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, fields

__all__ = [
    "SLO_METRICS",
    "RequestResult",
    "Stats",
    "Summary",
    "median_summary",
    "meets_slo",
    "parse_slo",
    "percentile",
    "summarize",
]

SLO_METRICS = ("ttft", "tpot", "e2e")


@dataclass
class RequestResult:
    """What the client saw of one request (seconds, measured on the client's clock)."""

    num_prompt_tokens: int
    num_output_tokens: int = 0
    ttft_s: float | None = None
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft_s is not None

    @property
    def tpot_s(self) -> float:
        """0 for a single-token output: it has no decode time to share out."""
        if self.num_output_tokens < 2 or self.ttft_s is None:
            return 0.0
        return (self.e2e_s - self.ttft_s) / (self.num_output_tokens - 1)

    def latency_ms(self, metric: str) -> float:
        seconds = {"ttft": self.ttft_s or 0.0, "tpot": self.tpot_s, "e2e": self.e2e_s}[metric]
        return seconds * 1000.0


@dataclass(frozen=True)
class Stats:
    """Mean and percentiles of one latency, in ms (NaN when there were no values)."""

    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values_ms: list[float]) -> Stats:
        if not values_ms:
            return cls(math.nan, math.nan, math.nan, math.nan)
        mean = sum(values_ms) / len(values_ms)
        return cls(mean, *(percentile(values_ms, q) for q in (50, 90, 99)))


@dataclass(frozen=True)
class Summary:
    """A run's figures; ``slo`` (ms per metric) is what ``goodput`` was judged by."""

    completed: int
    failed: int
    duration_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    ttft_ms: Stats
    tpot_ms: Stats
    itl_ms: Stats
    e2e_ms: Stats
    goodput: float
    good_fraction: float
    slo: dict[str, float]
    first_error: str | None


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), interpolating linearly between closest ranks.

    Raises:
        ValueError: no values, or q outside [0, 100].
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def parse_slo(items: list[str]) -> dict[str, float]:
    """``["ttft:2000", "tpot:200"]`` -> ``{"ttft": 2000.0, "tpot": 200.0}`` (ms).

    Raises:
        ValueError: an item not ``METRIC:MS`` with METRIC in SLO_METRICS and MS > 0.
    """
    slo: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"an SLO is METRIC:MS with METRIC in {SLO_METRICS}, got {item!r}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"SLO {item!r}: {value!r} is not a number of ms") from None
        if not ms > 0:
            raise ValueError(f"SLO {item!r}: the bound must be > 0 ms")
        slo[name] = ms
    return slo


def meets_slo(result: RequestResult, slo: dict[str, float]) -> bool:
    """A completed request within every bound (no SLO: every completed request)."""
    return result.ok and all(result.latency_ms(m) <= bound for m, bound in slo.items())


def summarize(results: list[RequestResult], duration_s: float, slo: dict[str, float]) -> Summary:
    """The run's figures from its requests' results and its wall time."""
    if duration_s <= 0:
        raise ValueError(f"duration must be > 0 s, got {duration_s}")
    done = [r for r in results if r.ok]
    num_in = sum(r.num_prompt_tokens for r in done)
    num_out = sum(r.num_output_tokens for r in done)
    good = sum(meets_slo(r, slo) for r in done)
    errors = [r.error for r in results if r.error is not None]
    return Summary(
        completed=len(done),
        failed=len(results) - len(done),
        duration_s=duration_s,
        num_prompt_tokens=num_in,
        num_output_tokens=num_out,
        request_throughput=len(done) / duration_s,
        input_throughput=num_in / duration_s,
        output_throughput=num_out / duration_s,
        ttft_ms=Stats.of([r.latency_ms("ttft") for r in done]),
        tpot_ms=Stats.of([r.latency_ms("tpot") for r in done if r.num_output_tokens > 1]),
        itl_ms=Stats.of([gap * 1000.0 for r in done for gap in r.itl_s]),
        e2e_ms=Stats.of([r.latency_ms("e2e") for r in done]),
        goodput=good / duration_s,
        good_fraction=good / len(results) if results else 0.0,
        slo=dict(slo),
        first_error=errors[0] if errors else None,
    )


def median_summary(summaries: list[Summary]) -> Summary:
    """Field by field, the median of repeated runs' summaries (each latency statistic
    on its own); ``slo`` and ``first_error`` from the first run that has one.

    Raises:
        ValueError: no summaries.
    """
    if not summaries:
        raise ValueError("median of no summaries")
    values: dict = {}
    for f in fields(Summary):
        column = [getattr(s, f.name) for s in summaries]
        if isinstance(column[0], Stats):
            values[f.name] = Stats(
                *(statistics.median(getattr(st, g.name) for st in column) for g in fields(Stats))
            )
        elif isinstance(column[0], (int, float)):
            values[f.name] = statistics.median(column)
    values["slo"] = summaries[0].slo
    values["first_error"] = next((s.first_error for s in summaries if s.first_error), None)
    return Summary(**values)
