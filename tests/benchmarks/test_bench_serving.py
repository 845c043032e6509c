"""bench_serving.py's pure parts: datasets, arrivals, percentiles, goodput, SSE, the
clients' timing and request bodies (over a mock transport), the runner's limits.
No model, no server."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from serving.arrivals import arrival_offsets  # noqa: E402
from serving.clients import GenerateClient, OpenAIClient, TokenClock  # noqa: E402
from serving.datasets import (  # noqa: E402
    BenchRequest,
    random_requests,
    shared_prefix_requests,
    token_pool,
)
from serving.metrics import (  # noqa: E402
    RequestResult,
    meets_slo,
    parse_slo,
    percentile,
    summarize,
)
from serving.prefix_cache import CacheCounts, metrics_counts  # noqa: E402
from serving.runner import run_workload  # noqa: E402
from serving.sse import (  # noqa: E402
    DONE,
    SSEParser,
    StreamError,
    completion_delta,
    generate_delta,
)

POOL = token_pool(1000, [0, 1, 2])


# ---- datasets --------------------------------------------------------------------------


def test_token_pool_leaves_out_special_ids():
    assert POOL == list(range(3, 1000))
    with pytest.raises(ValueError):
        token_pool(2, [0, 1])


def test_random_requests_fixed_lengths_and_ids_from_pool():
    reqs = random_requests(POOL, 20, 50, 7, 1.0, seed=3)
    assert len(reqs) == 20
    assert all(r.num_prompt_tokens == 50 and r.num_output_tokens == 7 for r in reqs)
    assert all(set(r.prompt_ids) <= set(POOL) for r in reqs)


def test_random_requests_lengths_within_range_and_varied():
    reqs = random_requests(POOL, 200, 100, 40, 0.5, seed=3)
    ins = [r.num_prompt_tokens for r in reqs]
    outs = [r.num_output_tokens for r in reqs]
    assert min(ins) >= 50 and max(ins) <= 100 and len(set(ins)) > 20
    assert min(outs) >= 20 and max(outs) <= 40 and len(set(outs)) > 10


def test_random_requests_reproducible_per_seed():
    assert random_requests(POOL, 5, 30, 4, 0.5, 9) == random_requests(POOL, 5, 30, 4, 0.5, 9)
    assert random_requests(POOL, 5, 30, 4, 0.5, 9) != random_requests(POOL, 5, 30, 4, 0.5, 10)


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_random_requests_rejects_bad_range_ratio(ratio):
    with pytest.raises(ValueError, match="range_ratio"):
        random_requests(POOL, 5, 30, 4, ratio, 0)


def test_random_requests_rejects_non_positive_length():
    with pytest.raises(ValueError, match="input_len"):
        random_requests(POOL, 5, 0, 4, 1.0, 0)


def test_shared_prefix_groups_share_exactly_their_system_prompt():
    reqs = shared_prefix_requests(POOL, 4, 5, 30, 10, 6, seed=2)
    assert len(reqs) == 20
    assert all(r.num_prompt_tokens == 40 and r.num_output_tokens == 6 for r in reqs)
    systems = [r.prompt_ids[:30] for r in reqs]
    assert sorted(systems.count(s) for s in set(systems)) == [5, 5, 5, 5]
    assert len({r.prompt_ids[30:] for r in reqs}) == 20  # every question its own
    order = [systems.index(s) for s in systems]  # first index of each one's group
    assert order != sorted(order)  # shuffled: groups interleave


# ---- arrivals --------------------------------------------------------------------------


def test_arrivals_inf_sends_all_at_once():
    assert arrival_offsets(4, math.inf, 0) == [0.0] * 4


def test_arrivals_poisson_mean_gap_and_order():
    offsets = arrival_offsets(20000, 4.0, seed=5)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert offsets[0] == 0.0 and min(gaps) >= 0.0
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.03)
    # exponential gaps: the standard deviation equals the mean
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.05)
    assert arrival_offsets(10, 4.0, 5) == offsets[:10]
    assert arrival_offsets(10, 4.0, 6) != offsets[:10]


def test_arrivals_reject_non_positive_rate():
    with pytest.raises(ValueError):
        arrival_offsets(3, 0.0, 0)


# ---- percentiles, SLOs, summaries ------------------------------------------------------


def test_percentile_interpolates_between_ranks():
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([1, 2, 3, 4], 0) == 1 and percentile([1, 2, 3, 4], 100) == 4
    assert percentile(list(range(1, 11)), 90) == pytest.approx(9.1)
    assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_parse_slo():
    assert parse_slo(["ttft:2000", "tpot:200.5"]) == {"ttft": 2000.0, "tpot": 200.5}
    for bad in (["ttft"], ["itl:5"], ["ttft:fast"], ["tpot:0"]):
        with pytest.raises(ValueError):
            parse_slo(bad)


def result(ttft: float, e2e: float, n_out: int, error: str | None = None) -> RequestResult:
    return RequestResult(
        num_prompt_tokens=10, num_output_tokens=n_out, ttft_s=ttft, e2e_s=e2e, error=error
    )


def test_tpot_excludes_the_first_token():
    assert result(0.5, 2.5, 5).tpot_s == pytest.approx(0.5)
    assert result(0.5, 0.5, 1).tpot_s == 0.0


def test_goodput_counts_requests_meeting_every_slo():
    slo = {"ttft": 1000.0, "tpot": 100.0}
    ok = result(0.9, 0.9 + 0.09 * 10, 11)
    slow_first = result(1.1, 1.2, 11)
    slow_decode = result(0.1, 0.1 + 0.2 * 10, 11)
    failed = result(0.1, 0.2, 11, error="HTTP 500")
    assert [meets_slo(r, slo) for r in (ok, slow_first, slow_decode, failed)] == [
        True, False, False, False,
    ]  # fmt: skip
    s = summarize([ok, slow_first, slow_decode, failed], duration_s=2.0, slo=slo)
    assert s.completed == 3 and s.failed == 1 and s.first_error == "HTTP 500"
    assert s.goodput == pytest.approx(0.5) and s.good_fraction == pytest.approx(0.25)
    assert summarize([ok, failed], 2.0, {}).goodput == pytest.approx(0.5)  # no SLO: completed


def test_summarize_throughput_and_latency_stats():
    a = RequestResult(100, 4, ttft_s=0.1, e2e_s=0.4, itl_s=[0.1, 0.1, 0.1])
    b = RequestResult(50, 2, ttft_s=0.3, e2e_s=0.5, itl_s=[0.2])
    s = summarize([a, b], duration_s=0.5, slo={})
    assert s.request_throughput == pytest.approx(4.0)
    assert s.input_throughput == pytest.approx(300.0)
    assert s.output_throughput == pytest.approx(12.0)
    assert s.ttft_ms.mean == pytest.approx(200.0) and s.ttft_ms.p50 == pytest.approx(200.0)
    assert s.tpot_ms.mean == pytest.approx(150.0)  # (100 + 200) / 2
    assert s.itl_ms.mean == pytest.approx(125.0)  # pooled over four gaps
    assert s.e2e_ms.p99 == pytest.approx(499.0)
    assert math.isnan(summarize([], 1.0, {}).ttft_ms.mean)


# ---- SSE -------------------------------------------------------------------------------


def feed_all(lines: list[str]) -> list:
    parser = SSEParser()
    return [e for e in (parser.feed(line) for line in lines) if e is not None]


def test_sse_events_comments_and_done():
    lines = ['data: {"a": 1}', "", ": keep-alive", "", "event: x", 'data:{"b":2}\r', "\r",
             "data: [DONE]", ""]  # fmt: skip
    assert feed_all(lines) == [{"a": 1}, {"b": 2}, DONE]


def test_sse_joins_multi_line_data():
    assert feed_all(['data: {"a":', "data: 1}", ""]) == [{"a": 1}]


def test_completion_delta():
    chunk = {"choices": [{"index": 0, "text": "hi", "finish_reason": None}], "usage": None}
    assert completion_delta(chunk) == ("hi", None)
    usage = {"prompt_tokens": 3, "completion_tokens": 5}
    assert completion_delta({"choices": [], "usage": usage}) == ("", usage)
    with pytest.raises(StreamError, match="overloaded"):
        completion_delta({"error": {"message": "overloaded"}})


def test_generate_delta():
    event = {"text": "ab", "delta": "b", "meta_info": {"completion_tokens": 2}}
    assert generate_delta(event) == ("b", 2)
    assert generate_delta({"text": "", "meta_info": {}}) == ("", None)
    with pytest.raises(StreamError, match="overloaded"):
        generate_delta({"error": {"message": "overloaded"}})


# ---- prefix-cache counters -------------------------------------------------------------


def test_metrics_counts_sums_every_series_of_radixlm_and_vllm():
    page = "\n".join(
        [
            "# HELP radixlm:prefix_cache_hits_total Prompt tokens found cached.",
            'radixlm:prefix_cache_queries_total{model_name="m"} 100.0',
            'radixlm:prefix_cache_hits_total{model_name="m"} 40.0',
            'vllm:prefix_cache_queries_total{engine="0"} 10',
            "vllm:prefix_cache_hits_total 5",
            'radixlm:prompt_tokens_total{model_name="m"} 999.0',
        ]
    )
    assert metrics_counts(page) == CacheCounts(queries=110.0, hits=45.0)
    run = CacheCounts(300.0, 150.0) - CacheCounts(100.0, 50.0)
    assert run == CacheCounts(200.0, 100.0) and run.hit_rate == 0.5
    assert CacheCounts().hit_rate == 0.0


# ---- clients and runner ----------------------------------------------------------------


def test_token_clock_ttft_and_gaps():
    times = iter([10.0, 10.5, 10.7, 11.0, 11.2])
    clock = TokenClock(now=lambda: next(times))
    clock.tick(), clock.tick(), clock.tick()
    r = clock.result(num_prompt_tokens=3, num_output_tokens=3)
    assert r.ttft_s == pytest.approx(0.5)
    assert r.itl_s == pytest.approx([0.2, 0.3])
    assert r.e2e_s == pytest.approx(1.2)


def mock_server(bodies: list[dict], status: int = 200):
    import httpx

    def sse(payload) -> str:
        return "data: " + (payload if isinstance(payload, str) else json.dumps(payload)) + "\n\n"

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m1"}, {"id": "m2"}]})
        bodies.append(json.loads(request.content))
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "busy"}})
        events = [{"choices": [{"index": 0, "text": t, "finish_reason": None}], "usage": None}
                  for t in ("a", "", "bc")]  # fmt: skip
        events.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
        body = "".join(sse(e) for e in events) + sse("[DONE]")
        return httpx.Response(200, content=body.encode())

    return httpx.MockTransport(handler)


def run_client(transport, request: BenchRequest) -> RequestResult:
    async def go():
        async with OpenAIClient("t", "http://test", transport=transport) as client:
            return await client.send(request)

    return asyncio.run(go())


def test_openai_client_forces_length_and_reads_usage():
    pytest.importorskip("httpx")
    bodies: list[dict] = []
    r = run_client(mock_server(bodies), BenchRequest((5, 6, 7), 4))
    assert r.ok and r.num_output_tokens == 4  # usage, not the two text chunks
    assert len(r.itl_s) == 1 and r.ttft_s is not None and r.e2e_s >= r.ttft_s
    (body,) = bodies
    assert body["model"] == "m1" and body["prompt"] == [5, 6, 7] and body["stream"]
    assert body["max_tokens"] == body["min_tokens"] == 4 and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_generate_client_sends_input_ids_and_counts_meta_info_tokens():
    import httpx

    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m1"}]})
        assert request.url.path == "/generate"
        bodies.append(json.loads(request.content))
        events = [
            {"text": t, "delta": d, "meta_info": {"completion_tokens": n}}
            for t, d, n in (("a", "a", 1), ("a", "", 2), ("abc", "bc", 4))
        ]
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, content=body.encode())

    async def go():
        async with GenerateClient("g", "http://test", transport=httpx.MockTransport(handler)) as c:
            return await c.send(BenchRequest((5, 6, 7), 4))

    r = asyncio.run(go())
    assert r.ok and r.num_output_tokens == 4 and len(r.itl_s) == 1
    (body,) = bodies
    assert body["input_ids"] == [5, 6, 7] and body["stream"] is True
    params = body["sampling_params"]
    assert params["max_new_tokens"] == params["min_new_tokens"] == 4 and params["ignore_eos"]


def test_openai_client_reports_http_errors():
    pytest.importorskip("httpx")
    r = run_client(mock_server([], status=503), BenchRequest((5,), 2))
    assert not r.ok and "HTTP 503" in r.error


class FakeClient:
    name = "fake"

    def __init__(self) -> None:
        self.in_flight = self.peak = 0
        self.sent_at: list[float] = []

    async def send(self, request: BenchRequest) -> RequestResult:
        self.sent_at.append(time.perf_counter())
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(0.02)
        self.in_flight -= 1
        return RequestResult(request.num_prompt_tokens, request.num_output_tokens, 0.01, 0.02)


def test_runner_holds_the_concurrency_limit_and_keeps_order():
    client = FakeClient()
    reqs = [BenchRequest((1,) * (i + 1), 1) for i in range(12)]
    results, duration = asyncio.run(run_workload(client, reqs, [0.0] * 12, 3))
    assert client.peak == 3
    assert [r.num_prompt_tokens for r in results] == list(range(1, 13))
    assert duration >= 4 * 0.02


def test_runner_sends_at_the_arrival_offsets():
    client = FakeClient()
    reqs = [BenchRequest((1,), 1)] * 3
    start = time.perf_counter()
    asyncio.run(run_workload(client, reqs, [0.0, 0.05, 0.1], None))
    sent = [t - start for t in sorted(client.sent_at)]
    assert sent[1] >= 0.05 and sent[2] >= 0.1
    with pytest.raises(ValueError):
        asyncio.run(run_workload(client, reqs, [0.0], None))


def test_plot_sweep_draws_finite_rates_only(tmp_path):
    pytest.importorskip("matplotlib")
    from serving.report import plot_sweep

    def s(ttft: float) -> object:
        return summarize([result(ttft, ttft + 1.0, 5)], 2.0, {"ttft": 1000.0})

    png = tmp_path / "sweep.png"
    assert not plot_sweep([("a", 1.0, s(0.1)), ("a", math.inf, s(0.2))], png, "t")
    assert not png.exists()
    runs = [("a", 1.0, s(0.1)), ("a", 2.0, s(0.5)), ("b", 1.0, s(0.2)), ("b", 2.0, s(2.0))]
    assert plot_sweep(runs, png, "t") and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_median_summary_takes_each_field_median():
    from serving.metrics import median_summary

    runs = [summarize([result(t, t + 1.0, 5)], d, {"ttft": 1000.0})
            for t, d in ((0.1, 2.0), (0.9, 4.0), (2.0, 1.0))]  # fmt: skip
    m = median_summary(runs)
    assert m.duration_s == 2.0 and m.ttft_ms.p99 == pytest.approx(900.0)
    assert m.output_throughput == pytest.approx(2.5)  # 5 / 2.0, the middle of 5, 1.25, 2.5
    assert m.goodput == pytest.approx(0.25)  # 1 good / 4 s, 1/2 s, 0 -> 0.25
    with pytest.raises(ValueError):
        median_summary([])


def test_machine_ticks_parsing():
    from serving.machine import machine_busy_ticks, process_ticks

    stat = "cpu  100 5 30 1000 7 2 3 1 0 0\ncpu0 50 2 15 500 3 1 1 0 0 0\n"
    assert machine_busy_ticks(stat) == 100 + 5 + 30 + 2 + 3 + 1
    with pytest.raises(ValueError):
        machine_busy_ticks("intr 5\n")
    line = "4242 (python -m (x)) S 17 4242 4242 0 -1 4194304 10 0 0 0 250 40 0 0 20 0 9"
    assert process_ticks(line) == (17, 290)


def test_the_kv_pool_flag_reaches_radixlm_sides_only():
    import argparse

    import bench_serving

    fixed = argparse.Namespace(max_total_tokens=4096)
    assert bench_serving.radixlm_pool_args("radixlm", fixed) == ("--max-total-tokens", "4096")
    assert bench_serving.radixlm_pool_args("router_cache_aware", fixed)[1] == "4096"
    assert bench_serving.radixlm_pool_args("vllm", fixed) == ()
    assert (
        bench_serving.radixlm_pool_args("radixlm", argparse.Namespace(max_total_tokens=None)) == ()
    )


def test_wait_quiet_waits_for_the_machine_to_fall_idle():
    from serving.machine import wait_quiet

    # busy seconds of the whole machine: 1 core busy for two windows, then idle
    readings = iter([0.0, 0.25, 0.5, 0.5])
    slept: list[float] = []
    waited = wait_quiet(0.1, 0.25, 10.0, lambda: next(readings), slept.append)
    assert waited == 0.75 and slept == [0.25] * 3


def test_wait_quiet_gives_up_at_its_timeout_and_without_proc():
    from serving.machine import wait_quiet

    clock = iter(float(i) for i in range(100))  # always 4 cores busy
    assert wait_quiet(0.1, 0.25, 1.0, lambda: next(clock), lambda _: None) == 1.0
    assert wait_quiet(busy_seconds=lambda: None, sleep=lambda _: None) == 0.0
