"""``GET /metrics``: the engine's counters and latency histograms in Prometheus' text
format, named as vLLM and SGLang name theirs, under a ``radixlm:`` prefix.

Nothing is counted here: at each scrape ``EngineCollector`` reads one
``Engine.get_stats()`` snapshot (the scheduler and the grammar compiler count
and observe, for every request whatever sent it) and writes it out. Each server
has its own ``CollectorRegistry`` (no process-global registry), so two servers in
one process export their own engines.

    counters    prompt_tokens, generation_tokens, request_success (finished),
                request_aborted, num_retractions, steps_ahead, paced_passes
                (passes whose prompt tokens target_tpot_ms cut), prefix_cache_queries (prompt
                tokens looked up), prefix_cache_hits (of them, found cached)
    gauges      num_requests_running, num_requests_waiting, kv_cache_usage_perc,
                kv_cache_slots (capacity), kv_cache_free_slots, kv_cache_cached_slots
    histograms  time_to_first_token_seconds, inter_token_latency_seconds,
                e2e_request_latency_seconds, request_queue_time_seconds,
                grammar_compile_seconds
    speculative decoding (engines that speculate; vLLM's names), by ``source``
    (ngram, radix): spec_decode_num_drafts (verify rows), spec_decode_num_draft_tokens,
                spec_decode_num_accepted_tokens (counters), spec_decode_acceptance_rate (gauge)
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from radixlm.runtime.entrypoints.engine import Engine, EngineStats
from radixlm.runtime.histogram import HistogramSnapshot

__all__ = ["CONTENT_TYPE", "PREFIX", "EngineCollector", "metrics_registry", "render"]

PREFIX = "radixlm:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineCollector(Collector):
    """The metrics of one engine, read from a stats snapshot at each scrape."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self._engine = engine
        self._labels = {"model_name": model_name}

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.get_stats()
        yield from self._counters(stats)
        yield from self._gauges(stats)
        yield from self._speculative(stats)
        latency = stats.latency
        for name, snapshot, what in (
            ("time_to_first_token_seconds", latency.ttft, "request arrival to first token"),
            ("inter_token_latency_seconds", latency.inter_token, "one output token to the next"),
            ("e2e_request_latency_seconds", latency.e2e, "request arrival to its end"),
            ("request_queue_time_seconds", latency.queue, "request arrival to admission"),
            ("grammar_compile_seconds", stats.grammar_compile_s, "one constraint compile"),
        ):
            yield self._histogram(name, f"Seconds from {what}.", snapshot)

    def _counters(self, stats: EngineStats) -> Iterator[Metric]:
        for name, value, doc in (
            ("prompt_tokens", stats.num_prompt_tokens, "Prompt tokens queued."),
            ("generation_tokens", stats.num_generated_tokens, "Output tokens sampled."),
            ("request_success", stats.num_finished - stats.num_aborted, "Requests finished."),
            ("request_aborted", stats.num_aborted, "Requests ended by an abort."),
            ("num_retractions", stats.num_retractions, "Running requests sent back to queue."),
            ("steps_ahead", stats.num_steps_ahead, "Passes built while the one before ran."),
            ("paced_passes", stats.num_paced_passes, "Passes target_tpot_ms cut prompts of."),
            ("prefix_cache_queries", stats.num_prompt_tokens, "Prompt tokens looked up."),
            ("prefix_cache_hits", stats.num_cached_tokens, "Prompt tokens found cached."),
        ):
            family = CounterMetricFamily(PREFIX + name, doc, labels=list(self._labels))
            family.add_metric(list(self._labels.values()), value)
            yield family

    def _speculative(self, stats: EngineStats) -> Iterator[Metric]:
        spec = stats.speculative
        if spec is None:
            return
        labels, values = list(self._labels), list(self._labels.values())
        drafts = CounterMetricFamily(
            PREFIX + "spec_decode_num_drafts", "Decode rows that verified proposals.", labels=labels
        )
        drafts.add_metric(values, spec.verify_rows)
        yield drafts
        for name, counts, doc in (
            ("spec_decode_num_draft_tokens", spec.proposed, "Proposed tokens verified."),
            ("spec_decode_num_accepted_tokens", spec.accepted, "Proposed tokens accepted."),
        ):
            family = CounterMetricFamily(PREFIX + name, doc, labels=[*labels, "source"])
            for source in sorted(spec.proposed):
                family.add_metric([*values, source], counts.get(source, 0))
            yield family
        rate = GaugeMetricFamily(
            PREFIX + "spec_decode_acceptance_rate",
            "Accepted proposed tokens per verified one (0-1).",
            labels=labels,
        )
        rate.add_metric(values, spec.acceptance_rate)
        yield rate

    def _gauges(self, stats: EngineStats) -> Iterator[Metric]:
        usage = stats.kv_used / stats.kv_capacity if stats.kv_capacity else 0.0
        for name, value, doc in (
            ("num_requests_running", stats.num_running, "Requests holding KV."),
            ("num_requests_waiting", stats.num_waiting, "Requests queued."),
            ("kv_cache_usage_perc", usage, "Share of KV slots held by requests (0-1)."),
            ("kv_cache_slots", stats.kv_capacity, "KV slots in the pool."),
            ("kv_cache_free_slots", stats.kv_free, "KV slots free."),
            ("kv_cache_cached_slots", stats.kv_cached, "KV slots only the radix cache keeps."),
        ):
            family = GaugeMetricFamily(PREFIX + name, doc, labels=list(self._labels))
            family.add_metric(list(self._labels.values()), value)
            yield family

    def _histogram(self, name: str, doc: str, snapshot: HistogramSnapshot) -> Metric:
        family = HistogramMetricFamily(PREFIX + name, doc, labels=list(self._labels))
        buckets = [(_le(bound), count) for bound, count in snapshot.cumulative()]
        family.add_metric(list(self._labels.values()), buckets, sum_value=snapshot.total)
        return family


def metrics_registry(engine: Engine, model_name: str) -> CollectorRegistry:
    """A registry of its own holding only this engine's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model_name))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text exposition format."""
    return generate_latest(registry)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))
