"""Speculative decoding through the server: the OpenAI client's chat with the per-request
``speculative_num_tokens`` (0: off) gives the same reply either way, /generate takes it
in ``sampling_params``, and /metrics exports the spec_decode_* counters."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixlm import Engine
from tests.runtime.entrypoints.http.conftest import wait_idle
from tests.servers import running_server

DOC = "Order 5531-B: 12 boxes of green tea, 4 boxes of black tea, shipped to 9 Elm Street."


@pytest.fixture(scope="module")
def spec_server(default_model_dir):
    engine = Engine(
        model_path=str(default_model_dir),
        dtype="float32",
        max_total_tokens=8192,
        speculative="ngram",
        speculative_calibrate=False,
    )
    try:
        with running_server(engine) as running:
            yield running, engine
    finally:
        engine.shutdown()


def _metric(text: str, name: str) -> dict[str, float]:
    """Samples of one family by their ``source`` label ("" when it has none)."""
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {s.labels.get("source", ""): s.value for s in family.samples}
    raise AssertionError(f"{name} not exported")


def test_chat_reply_is_the_same_with_and_without_speculation(spec_server):
    running, engine = spec_server
    client = openai.OpenAI(base_url=running.base_url + "/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": f"Repeat this line exactly: {DOC}"}]
    replies = []
    for k in (0, 4):
        before = engine.get_stats().speculative.verify_rows
        reply = client.chat.completions.create(
            model="default",
            messages=messages,
            temperature=0,
            max_tokens=48,
            extra_body={"speculative_num_tokens": k},
        )
        replies.append(reply.choices[0].message.content)
        wait_idle(engine)
        verified = engine.get_stats().speculative.verify_rows - before
        assert (verified > 0) == (k > 0)
    assert replies[0] == replies[1]
    assert "12 boxes of green tea" in replies[1]


def test_generate_and_metrics(spec_server):
    running, engine = spec_server
    with httpx.Client(base_url=running.base_url, timeout=120) as client:
        body = {
            "text": f"{DOC}\n{DOC}\n{DOC[:30]}",
            "sampling_params": {
                "temperature": 0,
                "max_new_tokens": 24,
                "speculative_num_tokens": 3,
            },
        }
        response = client.post("/generate", json=body)
        assert response.status_code == 200
        bad = client.post(
            "/generate", json={**body, "sampling_params": {"speculative_num_tokens": 17}}
        )
        assert bad.status_code == 400
        assert "speculative_num_tokens" in bad.json()["error"]["message"]
        wait_idle(engine)
        text = client.get("/metrics").text
    stats = engine.get_stats().speculative
    proposed = _metric(text, "radixlm:spec_decode_num_draft_tokens")
    accepted = _metric(text, "radixlm:spec_decode_num_accepted_tokens")
    assert proposed == {k: float(v) for k, v in stats.proposed.items()}
    assert accepted == {k: float(stats.accepted.get(k, 0)) for k in stats.proposed}
    assert _metric(text, "radixlm:spec_decode_num_drafts")[""] == stats.verify_rows > 0
    rate = _metric(text, "radixlm:spec_decode_acceptance_rate")[""]
    assert rate == pytest.approx(stats.num_accepted / stats.num_proposed)
