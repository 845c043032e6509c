"""``X-Request-Id``: taken from the request (as SGLang's router forwards it) or made,
answered in the response header, written in the request's log lines, and the start of
the engine's ids of the request's samples."""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
import time

import httpx
import pytest

from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.io.messages import GenerateRequest
from radixlm.runtime.io.sampling_params import SamplingParams
from tests.runtime.entrypoints.http.conftest import running_server, sse_events, wait_idle

# a loaded 2-core machine can take seconds: never httpx's 5 s default
post = functools.partial(httpx.post, timeout=120)
request = functools.partial(httpx.request, timeout=120)

CHAT = {
    "model": "default",
    "messages": [{"role": "user", "content": "Say hi"}],
    "max_tokens": 3,
    "temperature": 0,
}
GENERATE = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 3}}
RID = re.compile(r"(?P<prefix>.+)-[0-9a-f]{32}")


@pytest.fixture(scope="module")
def server(http_engine):
    with running_server(http_engine, log_requests=True) as running:
        yield running


def test_the_given_id_comes_back_and_starts_the_engine_ids(server):
    headers = {"X-Request-Id": "router-abc.123"}
    response = post(server.base_url + "/generate", json=GENERATE, headers=headers)
    assert response.status_code == 200 and response.headers["x-request-id"] == "router-abc.123"
    assert RID.fullmatch(response.json()["meta_info"]["id"])["prefix"] == "router-abc.123"
    chat = post(server.base_url + "/v1/chat/completions", json=CHAT, headers=headers)
    assert chat.status_code == 200 and chat.headers["x-request-id"] == "router-abc.123"


def test_without_one_the_server_makes_one_and_engine_ids_stay_random(server):
    response = post(server.base_url + "/generate", json=GENERATE)
    assert re.fullmatch("[0-9a-f]{32}", response.headers["x-request-id"])
    assert re.fullmatch("[0-9a-f]{32}", response.json()["meta_info"]["id"])


@pytest.mark.parametrize("bad", ["has space", "x" * 129, "caf\u00e9"])
def test_a_malformed_id_is_replaced(server, bad):
    headers = [(b"x-request-id", bad.encode("utf-8"))]
    response = post(server.base_url + "/generate", json=GENERATE, headers=headers)
    assert response.status_code == 200
    assert re.fullmatch("[0-9a-f]{32}", response.headers["x-request-id"])


def test_every_answer_carries_it_errors_and_other_routes_too(server):
    for method, path, body in (
        ("GET", "/health", None),
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", {"model": "nope", "messages": []}),
        ("GET", "/no/such/route", None),
    ):
        response = request(
            method, server.base_url + path, json=body, headers={"X-Request-Id": "any-1"}
        )
        assert response.headers["x-request-id"] == "any-1", path


def test_log_lines_name_the_request(server, caplog):
    caplog.set_level(logging.INFO, logger="radixlm.http")
    headers = {"X-Request-Id": "logged-42"}
    post(server.base_url + "/v1/chat/completions", json=CHAT, headers=headers)
    bad = {**CHAT, "n": 0}
    post(server.base_url + "/v1/chat/completions", json=bad, headers=headers)
    # the access line is written once the body is sent, after the client may have read it
    access: list[str] = []
    for _ in range(200):
        access = [r.getMessage() for r in caplog.records if r.name == "radixlm.http.access"]
        if sum("request_id=logged-42" in m for m in access) >= 2:
            break
        time.sleep(0.01)
    assert any(
        '"POST /v1/chat/completions" 200' in m and "request_id=logged-42" in m for m in access
    )
    assert any(
        '"POST /v1/chat/completions" 400' in m and "request_id=logged-42" in m for m in access
    )
    prompts = [r.getMessage() for r in caplog.records if "prompt=" in r.getMessage()]
    assert any("request_id=logged-42" in m for m in prompts)  # --log-requests' line


def test_the_same_id_twice_in_flight_breaks_nothing(server, http_engine):
    """Two streams with one X-Request-Id at once: each gets its own tokens and its own
    engine id; aborting one by that id leaves the other running to its end."""
    headers = {"X-Request-Id": "dup"}
    body = {
        **GENERATE,
        "stream": True,
        "sampling_params": {"max_new_tokens": 24, "ignore_eos": True},
    }
    results: dict[int, list[dict]] = {}

    def stream(i: int) -> None:
        with httpx.stream(
            "POST", server.base_url + "/generate", json=body, headers=headers, timeout=60
        ) as r:
            r.read()
            results[i] = [json.loads(e) for e in sse_events(r) if e != "[DONE]"]

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    ids = {results[i][-1]["meta_info"]["id"] for i in range(2)}
    assert len(ids) == 2 and all(RID.fullmatch(i)["prefix"] == "dup" for i in ids)
    for i in range(2):
        final = results[i][-1]
        assert final["meta_info"]["finish_reason"]["type"] == "length"
        assert len(final["output_ids"]) == 24
    wait_idle(http_engine)


def test_abort_by_a_prefixed_id_stops_only_that_request(server, http_engine):
    headers = {"X-Request-Id": "dup2"}
    params = {"max_new_tokens": 160, "ignore_eos": True}
    body = {**GENERATE, "stream": True, "sampling_params": params}
    finals: dict[int, dict] = {}
    first_ids: dict[int, str] = {}
    errors: list[BaseException] = []
    started = threading.Barrier(3)

    def stream(i: int) -> None:
        try:
            with httpx.stream(
                "POST", server.base_url + "/generate", json=body, headers=headers, timeout=120
            ) as r:
                events = (json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {"))
                first_ids[i] = next(events)["meta_info"]["id"]
                started.wait(timeout=60)
                for event in events:
                    finals[i] = event
        except BaseException as e:  # reported below
            errors.append(e)
            started.abort()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    started.wait(timeout=60)
    aborted = post(server.base_url + "/abort_request", json={"rid": first_ids[0]})
    assert aborted.status_code == 200
    assert post(server.base_url + "/abort_request", json={"rid": "dup2"}).status_code == 404
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert finals[0]["meta_info"]["finish_reason"]["type"] == "abort"
    assert finals[1]["meta_info"]["finish_reason"]["type"] == "length"
    wait_idle(http_engine)


def test_the_engine_prefixes_and_checks_request_ids(http_engine):
    params = SamplingParams(max_new_tokens=2, n=2)
    outputs = http_engine.generate_requests(
        [GenerateRequest(input_ids=(1, 2, 3), sampling_params=params, request_id="call-7")]
    )
    assert [RID.fullmatch(o.rid)["prefix"] for o in outputs] == ["call-7", "call-7"]
    assert outputs[0].rid != outputs[1].rid
    for bad in ("", "a b", "x" * 129, 7):
        with pytest.raises(InvalidRequestError, match="request_id"):
            http_engine.generate_requests([GenerateRequest(input_ids=(1,), request_id=bad)])


def test_outputs_carry_their_stage_times(http_engine):
    (out,) = http_engine.generate_requests(
        [GenerateRequest(input_ids=(1, 2, 3), sampling_params=SamplingParams(max_new_tokens=3))]
    )
    t = out.times
    assert t is not None and t.created_at <= t.admitted_at <= t.first_token_at <= t.finished_at
    assert out.ttft == pytest.approx(t.first_token_at - t.created_at)
