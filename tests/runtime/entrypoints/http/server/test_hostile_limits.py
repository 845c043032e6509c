"""Limits a hostile client found missing or misreported, one regression test each over
real HTTP on the default model: a request that can never be served is a 400 naming the
limit, whatever is in flight; a stop_regex is bounded by what it expands to; the
Responses API's echoed fields are capped as OpenAI caps them; several API keys, each
seeing only its own stored responses.
"""

from __future__ import annotations

import contextlib

import httpx
import pytest

from tests.runtime.entrypoints.http.conftest import (
    error_of,
    running_server,
    wait_idle,
    wait_released,
)

CHAT = {"model": "default", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}
COMPLETION = {"model": "default", "prompt": "Say hi.", "max_tokens": 2}
RESPONSE = {"model": "default", "input": "Say hi.", "max_output_tokens": 2, "temperature": 0}


@contextlib.contextmanager
def generations_in_flight(state, num: int):
    """``num`` generations held, as running requests hold them."""
    ticket = state.admission.acquire(num)
    try:
        yield
    finally:
        ticket.release()


# ---- 5. n past max_n got a retryable 503 while anything was in flight ---------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**CHAT, "n": 256}),
        ("/v1/completions", {**COMPLETION, "n": 256}),
        ("/v1/completions", {**COMPLETION, "prompt": ["a", "b"], "n": 65}),
        ("/generate", {"text": "a", "sampling_params": {"n": 256, "max_new_tokens": 1}}),
        ("/generate", {"text": ["a", "b"], "sampling_params": {"n": 65, "max_new_tokens": 1}}),
    ],
)
@pytest.mark.parametrize("in_flight", [0, 2])
def test_n_past_max_n_is_a_400_naming_it_whatever_is_in_flight(
    http, server, http_engine, path, body, in_flight
):
    assert http_engine.config.scheduler.max_n == 64
    with generations_in_flight(server.state, in_flight):
        error = error_of(http.post(path, json=body))
    assert error["param"] == "n" and error["code"] == "request_limit_exceeded"
    assert "max_n 64" in error["message"] and "retry" not in error["message"]
    wait_released(server.state)
    wait_idle(http_engine)


def test_a_request_that_fits_once_others_finish_is_the_retryable_503(http, server):
    limit = server.state.admission.limit
    with generations_in_flight(server.state, limit - 1):
        response = http.post("/v1/chat/completions", json={**CHAT, "n": 2})
    assert error_of(response, 503)["code"] == "server_overloaded"
    assert response.headers["Retry-After"] == "1"
    wait_released(server.state)


# ---- 6. a counted-repeat stop_regex held ~250 MB while compiled ---------------------------


PAST_THE_LIMIT = ["a{1000000}", "(a{1000}){1000}", "(?:x{100}y){100}", "a{8193}"]


@pytest.mark.parametrize("pattern", PAST_THE_LIMIT)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/generate"])
def test_a_stop_regex_past_its_expanded_size_is_a_400_naming_the_limit(http, path, pattern):
    if path == "/generate":
        body = {"text": "Say hi.", "sampling_params": {"max_new_tokens": 2, "stop_regex": pattern}}
    else:
        body = {**(CHAT if "chat" in path else COMPLETION), "stop_regex": [pattern]}
    error = error_of(http.post(path, json=body))
    assert error["param"] == "stop_regex" and error["code"] == "request_limit_exceeded"
    assert "max_stop_regex_size" in error["message"] and "8192" in error["message"]


def test_the_size_counts_all_patterns_and_a_pattern_at_the_limit_is_served(http, http_engine):
    at_limit = {**CHAT, "stop_regex": ["a{8004}", r"\d{4}-\d{2}", "(ab|c){60}b"]}  # 8192
    assert http.post("/v1/chat/completions", json=at_limit).status_code == 200
    past = {**CHAT, "stop_regex": ["a{8000}", "(ab|c){65}"]}  # 8195 together
    error = error_of(http.post("/v1/chat/completions", json=past))
    assert error["param"] == "stop_regex" and "8195" in error["message"]
    wait_idle(http_engine)


# ---- also: best_of 0 was refused as "best_of above 1" -------------------------------------


@pytest.mark.parametrize("value", [0, -3, True, 1.0])
def test_best_of_below_1_says_what_best_of_must_be(http, value):
    error = error_of(http.post("/v1/completions", json={**COMPLETION, "best_of": value}))
    assert error["param"] == "best_of"
    expected = f"best_of: must be an integer >= 1 (1, the default, is served), got {value!r}"
    assert error["message"] == expected


def test_best_of_above_1_is_still_refused_as_unsupported(http):
    error = error_of(http.post("/v1/completions", json={**COMPLETION, "best_of": 2}))
    assert error["param"] == "best_of" and "best_of above 1" in error["message"]


# ---- also: Responses' echoed fields had no caps (7 MB each came back) -----------------------


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", "at most 16 key-value pairs"),
        ({"metadata": {"k" * 65: "v"}}, "metadata", "keys of at most 64 characters"),
        ({"metadata": {"k": "v" * 513}}, "metadata", "values of at most 512 characters"),
        ({"user": "u" * 257}, "user", "at most 256 characters"),
        (
            {"text": {"format": {"type": "json_object", "name": "n" * 7_000_000}}},
            "text.format.name",
            "1-64 characters of a-z, A-Z, 0-9, '_' and '-', got 7000000 characters",
        ),
        (
            {"text": {"format": {"type": "json_object", "name": "has space"}}},
            "text.format.name",
            "got 'has space'",
        ),
    ],
)
def test_responses_fields_past_openais_caps_are_a_400(http, fields, param, message):
    error = error_of(http.post("/v1/responses", json={**RESPONSE, **fields}))
    assert error["param"] == param and message in error["message"]
    assert len(error["message"]) < 200


def test_responses_fields_at_the_caps_are_echoed(http, http_engine):
    metadata = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    name = "Aa0_-" * 12 + "abcd"  # 64
    body = {
        **RESPONSE,
        "metadata": metadata,
        "user": "u" * 256,
        "text": {"format": {"type": "json_object", "name": name}},
    }
    response = http.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    echoed = response.json()
    assert echoed["metadata"] == metadata and echoed["user"] == "u" * 256
    assert echoed["text"]["format"]["name"] == name
    wait_idle(http_engine)


# ---- also: one --api-key, so every key holder read and deleted every stored response -------


@pytest.fixture(scope="module")
def keyed(http_engine, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text("# the team's keys\n  gamma  \n\ndelta\n", encoding="utf-8")
    with running_server(http_engine, api_key=("alpha", "beta"), api_key_file=str(key_file)) as s:
        yield s


def as_key(server, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )


def test_every_key_given_or_in_the_key_file_is_let_in(keyed):
    for key in ("alpha", "beta", "gamma", "delta"):
        with as_key(keyed, key) as client:
            assert client.get("/v1/models").status_code == 200
    for key in ("alphabeta", "# the team's keys", "gamm", "delta,gamma"):
        with as_key(keyed, key) as client:
            assert error_of(client.get("/v1/models"), 401)["code"] == "invalid_api_key"


def test_a_stored_response_is_seen_only_with_the_key_that_stored_it(keyed, http_engine):
    with as_key(keyed, "alpha") as alpha, as_key(keyed, "gamma") as gamma:
        stored = alpha.post("/v1/responses", json=RESPONSE)
        assert stored.status_code == 200, stored.text
        rid = stored.json()["id"]
        assert alpha.get(f"/v1/responses/{rid}").json()["id"] == rid
        # another key: as if it did not exist, for every way of reaching it
        unseen = error_of(gamma.get(f"/v1/responses/{rid}"), 404)
        assert unseen["code"] == "response_not_found" and unseen["param"] == "response_id"
        gone = error_of(alpha.get("/v1/responses/resp_never"), 404)
        assert unseen["message"] == gone["message"].replace("resp_never", rid)
        follow = {**RESPONSE, "previous_response_id": rid}
        error = error_of(gamma.post("/v1/responses", json=follow), 404)
        assert error["param"] == "previous_response_id"
        assert error_of(gamma.delete(f"/v1/responses/{rid}"), 404)["param"] == "response_id"
        # the owner still has it, continues from it, and deletes it
        assert alpha.get(f"/v1/responses/{rid}").status_code == 200
        assert alpha.post("/v1/responses", json=follow).status_code == 200
        assert alpha.delete(f"/v1/responses/{rid}").json()["deleted"] is True
        assert error_of(alpha.get(f"/v1/responses/{rid}"), 404)["code"] == "response_not_found"
    wait_idle(http_engine)


def test_an_open_server_keeps_one_shared_store(http, http_engine):
    rid = http.post("/v1/responses", json=RESPONSE).json()["id"]
    assert http.get(f"/v1/responses/{rid}").status_code == 200
    assert http.delete(f"/v1/responses/{rid}").status_code == 200
    wait_idle(http_engine)
