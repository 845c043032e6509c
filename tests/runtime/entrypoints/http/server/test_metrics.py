"""GET /metrics on a real server: Prometheus' text format, the engine's own counts."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.runtime.entrypoints.http.conftest import wait_idle


def _families(client: httpx.Client) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {f.name: f for f in text_string_to_metric_families(response.text)}


def _value(families: dict, name: str, suffix: str = "") -> float:
    (sample,) = [s for s in families[name].samples if s.name == name + suffix]
    return sample.value


def test_metrics_count_what_the_engine_served(server, http_engine):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        before = _families(client)
        body = {
            "text": ["One two", "Three four"],
            "sampling_params": {"max_new_tokens": 5, "ignore_eos": True, "temperature": 0},
        }
        assert client.post("/generate", json=body).status_code == 200
        wait_idle(http_engine)
        after = _families(client)
    stats = http_engine.get_stats()
    generated = "radixlm:generation_tokens"
    assert _value(after, generated, "_total") == stats.num_generated_tokens
    assert _value(after, generated, "_total") - _value(before, generated, "_total") == 10
    assert _value(after, "radixlm:prompt_tokens", "_total") == stats.num_prompt_tokens
    assert _value(after, "radixlm:prefix_cache_hits", "_total") == stats.num_cached_tokens
    assert _value(after, "radixlm:num_requests_running") == 0
    assert _value(after, "radixlm:kv_cache_usage_perc") == 0.0
    assert _value(after, "radixlm:kv_cache_slots") == stats.kv_capacity
    for name in (
        "time_to_first_token_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
    ):
        full = "radixlm:" + name
        assert _value(after, full, "_count") - _value(before, full, "_count") == 2
        buckets = [s for s in after[full].samples if s.name == full + "_bucket"]
        assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == _value(
            after, full, "_count"
        )
    itl = "radixlm:inter_token_latency_seconds"
    assert _value(after, itl, "_count") - _value(before, itl, "_count") == 8  # 2 x (5 - 1)
    assert after[itl].samples[0].labels["model_name"] == server.state.model_name


def test_the_grafana_dashboard_queries_only_exported_metrics(server):
    import json
    import re
    from pathlib import Path

    dashboard = Path(__file__).parents[5] / "docs" / "grafana-dashboard.json"
    exprs = [t["expr"] for p in json.loads(dashboard.read_text())["panels"] for t in p["targets"]]
    queried = {m for e in exprs for m in re.findall(r"radixlm:[a-z0-9_]+", e)}
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        exported = {s.name for f in _families(client).values() for s in f.samples}
    assert len(queried) >= 15 and queried <= exported, queried - exported
