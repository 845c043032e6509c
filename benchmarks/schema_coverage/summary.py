"""Outcomes -> one row per (backend, dataset), plus an ``all`` row per backend.

    compiled  share whose standalone compile succeeded
    valid     share with a valid object
    refused   share refused at compile (keywords counted by ``refusal_counts``)
    length    share cut at max_new_tokens (finish reason length)
    invalid   count complete but not valid (must be 0)
    crashed   count of any other exception
    valid_of_finished  valid / (schemas - length): the headline figure, target >= 85%

Times: compile median / P99 over the compiles that succeeded; mask fill median / P99
over every replayed token of the dataset.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from serving.metrics import percentile

from schema_coverage.outcomes import SchemaOutcome

__all__ = [
    "PAPER_GUIDANCE",
    "CoverageRow",
    "format_table",
    "paper_comparison",
    "refusal_counts",
    "summarize",
]

ALL = "all"
# JSONSchemaBench (arXiv 2501.10868): Guidance's empirical coverage per dataset.
PAPER_GUIDANCE = {
    "Glaiveai2K": 0.94,
    "Github_easy": 0.82,
    "Snowplow": 0.80,
    "Github_medium": 0.75,
    "WashingtonPost": 0.70,
    "Kubernetes": 0.65,
    "Github_hard": 0.40,
}


@dataclass(frozen=True)
class CoverageRow:
    """One backend on one dataset (or ``all``); counts, and times in seconds."""

    backend: str
    dataset: str
    num_schemas: int
    num_compiled: int
    num_valid: int
    num_refused: int
    num_length: int
    num_invalid: int
    num_crashed: int
    compile_p50_s: float | None
    compile_p99_s: float | None
    mask_fill_p50_s: float | None
    mask_fill_p99_s: float | None

    def share(self, count: int) -> float:
        return count / self.num_schemas if self.num_schemas else 0.0

    @property
    def valid_of_finished(self) -> float | None:
        """Valid share of the schemas that did not end at the token limit."""
        finished = self.num_schemas - self.num_length
        return self.num_valid / finished if finished else None


def summarize(outcomes: Iterable[SchemaOutcome]) -> list[CoverageRow]:
    """Rows by backend (first-seen order), datasets sorted, each backend's ``all`` last."""
    groups: dict[tuple[str, str], list[SchemaOutcome]] = {}
    for o in outcomes:
        groups.setdefault((o.backend, o.dataset), []).append(o)
        groups.setdefault((o.backend, ALL), []).append(o)
    backends = list(dict.fromkeys(b for b, _ in groups))
    keys = [(b, d) for b in backends for d in sorted(d for bb, d in groups if bb == b and d != ALL)]
    return [_row(b, d, groups[(b, d)]) for b, d in keys + [(b, ALL) for b in backends]]


def _row(backend: str, dataset: str, group: list[SchemaOutcome]) -> CoverageRow:
    count = Counter(o.status for o in group)
    compiles = [o.compile_s for o in group if o.compile_s is not None]
    fills = [t for o in group for t in o.mask_fill_s]
    return CoverageRow(
        backend,
        dataset,
        num_schemas=len(group),
        num_compiled=sum(o.compiled for o in group),
        num_valid=count["valid"],
        num_refused=count["refused"],
        num_length=count["length"],
        num_invalid=count["invalid"],
        num_crashed=count["crash"],
        compile_p50_s=statistics.median(compiles) if compiles else None,
        compile_p99_s=percentile(compiles, 99) if compiles else None,
        mask_fill_p50_s=statistics.median(fills) if fills else None,
        mask_fill_p99_s=percentile(fills, 99) if fills else None,
    )


def refusal_counts(outcomes: Iterable[SchemaOutcome]) -> dict[str, Counter]:
    """Per backend: how many refused schemas named each keyword / format / reason."""
    counts: dict[str, Counter] = {}
    for o in outcomes:
        counts.setdefault(o.backend, Counter())
        counts[o.backend].update(o.refused if o.status == "refused" else ())
    return counts


_HEADER = (
    f"{'backend':10s} {'dataset':15s} {'n':>4s} {'compiled':>8s} {'valid':>6s} {'refused':>7s} "
    f"{'length':>6s} {'invalid':>7s} {'crash':>5s} {'valid/fin':>9s} "
    f"{'compile ms p50/p99':>18s} {'fill us p50/p99':>16s}"
)


def format_table(rows: list[CoverageRow]) -> str:
    """The rows as a fixed-width table: shares in percent, invalid and crash as counts."""
    return "\n".join([_HEADER, "-" * len(_HEADER), *(_format_row(r) for r in rows)])


def _format_row(r: CoverageRow) -> str:
    fin = "-" if r.valid_of_finished is None else f"{r.valid_of_finished * 100:.0f}%"
    return (
        f"{r.backend:10s} {r.dataset:15s} {r.num_schemas:4d} {_pct(r, r.num_compiled):>8s} "
        f"{_pct(r, r.num_valid):>6s} {_pct(r, r.num_refused):>7s} {_pct(r, r.num_length):>6s} "
        f"{r.num_invalid:7d} {r.num_crashed:5d} {fin:>9s} "
        f"{_pair(r.compile_p50_s, r.compile_p99_s, 1e3, 1):>18s} "
        f"{_pair(r.mask_fill_p50_s, r.mask_fill_p99_s, 1e6, 0):>16s}"
    )


def _pct(row: CoverageRow, count: int) -> str:
    return f"{row.share(count) * 100:.0f}%"


def _pair(p50: float | None, p99: float | None, scale: float, digits: int) -> str:
    if p50 is None or p99 is None:
        return "-"
    return f"{p50 * scale:.{digits}f} / {p99 * scale:.{digits}f}"


def paper_comparison(rows: list[CoverageRow], backend: str) -> str:
    """One line: ``backend``'s valid share per dataset against the paper's Guidance."""
    ours = {r.dataset: r for r in rows if r.backend == backend}
    parts = [
        f"{d} {ours[d].share(ours[d].num_valid):.2f} ({_fin(ours[d])}) vs {paper:.2f}"
        for d, paper in PAPER_GUIDANCE.items()
        if d in ours
    ]
    return (
        f"{backend} valid share (of those not cut at the token limit) vs JSONSchemaBench's "
        "Guidance coverage: " + ", ".join(parts)
    )


def _fin(row: CoverageRow) -> str:
    return "-" if row.valid_of_finished is None else f"{row.valid_of_finished:.2f}"
