"""What a run prints and draws: one column per (side, rate), the paired ratios of
sides to the first, and for a rate sweep a PNG of P99 TTFT and goodput against request rate."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from pathlib import Path

from serving.metrics import Summary

__all__ = ["Run", "plot_sweep", "print_ratios", "print_table", "run_label", "summary_dict"]

Run = tuple[str, float, Summary]  # (side, request rate, summary)

_ROWS = [
    ("completed", lambda s: s.completed, "{:.0f}"),
    ("failed", lambda s: s.failed, "{:.0f}"),
    ("duration (s)", lambda s: s.duration_s, "{:.2f}"),
    ("requests/s", lambda s: s.request_throughput, "{:.3f}"),
    ("input tok/s", lambda s: s.input_throughput, "{:.1f}"),
    ("output tok/s", lambda s: s.output_throughput, "{:.1f}"),
    *(
        (f"{label} {stat} (ms)", lambda s, a=attr, st=stat: getattr(getattr(s, a), st), "{:.1f}")
        for label, attr in (
            ("TTFT", "ttft_ms"),
            ("TPOT", "tpot_ms"),
            ("ITL", "itl_ms"),
            ("E2E", "e2e_ms"),
        )
        for stat in ("mean", "p50", "p90", "p99")
    ),  # fmt: skip
    ("goodput (req/s)", lambda s: s.goodput, "{:.3f}"),
    ("good (%)", lambda s: 100.0 * s.good_fraction, "{:.1f}"),
]


def run_label(side: str, rate: float) -> str:
    return f"{side}@{'inf' if math.isinf(rate) else f'{rate:g}'}"


def print_table(runs: list[Run]) -> None:
    width = max(14, *(len(run_label(side, rate)) + 2 for side, rate, _ in runs))
    print(f"{'':22}" + "".join(f"{run_label(side, rate):>{width}}" for side, rate, _ in runs))
    for name, get, fmt in _ROWS:
        cells = "".join(f"{fmt.format(get(s)):>{width}}" for _, _, s in runs)
        print(f"{name:22}{cells}")
    for side, rate, s in runs:
        if s.first_error:
            print(f"{run_label(side, rate)}: {s.failed} failed; first error: {s.first_error}")


def print_ratios(
    summaries: dict[tuple[str, float], list[Summary]], sides: list[str], rates: list[float]
) -> dict[str, dict[str, float]]:
    """Per rate, each side's output tok/s over the first side's, paired run by run
    (the median of the per-repeat ratios), and every side's median goodput. Returns
    ``{rate label: {side: ratio}}``."""
    out: dict[str, dict[str, float]] = {}
    if len(sides) < 2:
        return out
    for rate in rates:
        label = "inf" if math.isinf(rate) else f"{rate:g}"
        base = summaries[(sides[0], rate)]
        ratios = {}
        for side in sides[1:]:
            runs = zip(summaries[(side, rate)], base)
            pairs = [s.output_throughput / b.output_throughput for s, b in runs if b.completed]
            if pairs:
                ratios[side] = statistics.median(pairs)
        goodput = ", ".join(
            f"{side} {statistics.median(s.goodput for s in summaries[(side, rate)]):.3f}"
            for side in sides
        )
        parts = [f"{side} / {sides[0]} output tok/s = {r:.3f}" for side, r in ratios.items()]
        print(f"rate {label}: " + "; ".join(parts) + f"; goodput (req/s): {goodput}")
        out[label] = ratios
    return out


def plot_sweep(runs: list[Run], path: Path, title: str) -> bool:
    """P99 TTFT and goodput against request rate, a curve per side (finite rates
    only: inf has no place on the axis). Returns False when no side has two finite
    rates to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = list(dict.fromkeys(side for side, _, _ in runs))
    curves = {
        side: sorted((rate, s) for sd, rate, s in runs if sd == side and math.isfinite(rate))
        for side in sides
    }
    if not any(len(points) >= 2 for points in curves.values()):
        return False
    fig, (ax_ttft, ax_good) = plt.subplots(1, 2, figsize=(10, 4))
    for side, points in curves.items():
        rates = [rate for rate, _ in points]
        ax_ttft.plot(rates, [s.ttft_ms.p99 for _, s in points], marker="o", label=side)
        ax_good.plot(rates, [s.goodput for _, s in points], marker="o", label=side)
    ax_ttft.set(xlabel="request rate (req/s)", ylabel="P99 TTFT (ms)", title="P99 TTFT")
    slo = next(iter(curves.values()))[0][1].slo if curves else {}
    slo_text = ", ".join(f"{k} <= {v:g} ms" for k, v in slo.items()) or "no SLO"
    ax_good.set(xlabel="request rate (req/s)", ylabel="goodput (req/s)",
                title=f"goodput ({slo_text})")  # fmt: skip
    for ax in (ax_ttft, ax_good):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def summary_dict(s: Summary) -> dict:
    return asdict(s)
