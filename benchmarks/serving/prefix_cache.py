"""How much of a run's prompts a side found in its prefix caches: the servers' own
counters, read before and after the run.

    radixlm   ``radixlm:prefix_cache_queries_total`` / ``..._hits_total`` (prompt tokens
              looked up / found cached) from ``/metrics``
    vLLM      ``vllm:prefix_cache_queries_total`` / ``..._hits_total``, the same meaning
    router    the sum over its replicas (their URLs from the router's ``/workers``)
    engine    ``Engine.get_stats()``: ``num_prompt_tokens`` / ``num_cached_tokens``

Standard library only (urllib).
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CacheCounts", "engine_counts", "metrics_counts", "replica_urls", "url_counts"]

_SAMPLE = re.compile(r"^\w+:prefix_cache_(queries|hits)_total(?:\{[^}]*\})? (\S+)$", re.M)


@dataclass(frozen=True)
class CacheCounts:
    """Prompt tokens looked up in the prefix cache and, of them, found there."""

    queries: float = 0.0
    hits: float = 0.0

    def __add__(self, other: CacheCounts) -> CacheCounts:
        return CacheCounts(self.queries + other.queries, self.hits + other.hits)

    def __sub__(self, other: CacheCounts) -> CacheCounts:
        return CacheCounts(self.queries - other.queries, self.hits - other.hits)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def metrics_counts(text: str) -> CacheCounts:
    """The prefix-cache counters in a Prometheus text page (every series summed)."""
    queries = hits = 0.0
    for kind, value in _SAMPLE.findall(text):
        if kind == "queries":
            queries += float(value)
        else:
            hits += float(value)
    return CacheCounts(queries, hits)


def url_counts(urls: Sequence[str]) -> CacheCounts:
    """The counters of the servers at ``urls``, summed."""
    total = CacheCounts()
    for url in urls:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as r:
            total += metrics_counts(r.read().decode())
    return total


def replica_urls(router_url: str) -> list[str]:
    """The workers a sglang-router routes to (its ``/workers``)."""
    with urllib.request.urlopen(router_url.rstrip("/") + "/workers", timeout=10) as r:
        return [w["url"] for w in json.loads(r.read())["workers"]]


def engine_counts(engine: Any) -> Callable[[], CacheCounts]:
    def read() -> CacheCounts:
        stats = engine.get_stats()
        return CacheCounts(stats.num_prompt_tokens, stats.num_cached_tokens)

    return read
