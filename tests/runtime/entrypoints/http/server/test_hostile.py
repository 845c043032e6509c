"""The eight defects a hostile client found over HTTP, one regression test
each, on the default model: every one of them once killed, froze or misled the server."""

from __future__ import annotations

import gc
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from radixlm.runtime.io.stop_strings import StopStrings
from tests.runtime.entrypoints.http.conftest import (
    error_of,
    running_server,
    wait_idle,
    wait_released,
)

CHAT = {"model": "default", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
GREEDY = {"max_new_tokens": 6, "temperature": 0.0}


# ---- 1. a megabyte stop string (the OOM killer ended the process) ------------------------


def test_a_megabyte_stop_string_is_a_400_naming_the_limit(http, http_engine):
    response = http.post("/v1/chat/completions", json={**CHAT, "stop": ["y" * 1_000_000]})
    error = error_of(response)
    assert error["param"] == "stop" and error["code"] == "request_limit_exceeded"
    assert "max_stop_string_chars" in error["message"]
    many = {**CHAT, "stop": ["y" * 1000] * 5}  # each under the cap, 5,000 in all
    assert "max_stop_chars" in error_of(http.post("/v1/chat/completions", json=many))["message"]
    at_limit = {**CHAT, "stop": ["y" * 1024, "z" * 1024], "n": 4}
    response = http.post("/v1/chat/completions", json=at_limit)
    assert response.status_code == 200 and len(response.json()["choices"]) == 4
    wait_idle(http_engine)


def test_the_stop_automaton_is_freed_with_its_request(http, http_engine):
    stop = "zq" * 500  # found nowhere else
    response = http.post("/v1/chat/completions", json={**CHAT, "stop": [stop], "n": 3})
    assert response.status_code == 200
    wait_idle(http_engine)
    deadline = time.monotonic() + 10  # the handler lets go of its last chunk just after
    while time.monotonic() < deadline:
        gc.collect()
        if not any(type(o) is StopStrings and o.stops == (stop,) for o in gc.get_objects()):
            return
        time.sleep(0.1)
    raise AssertionError("the request's stop automaton outlived it")


# ---- 2. a 478 MB logprob body built on the event loop (/health waited 7.5 s) -------------


def test_top_logprobs_num_past_20_is_a_400(http):
    body = {"input_ids": list(range(300)), "return_logprob": True, "logprob_start_len": 0}
    error = error_of(http.post("/generate", json={**body, "top_logprobs_num": 49151}))
    assert error["param"] == "top_logprobs_num" and "max_top_logprobs_num" in error["message"]


def test_more_logprob_entries_than_allowed_is_a_400(http):
    body = {
        "input_ids": list(range(300)),
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 20,
        "sampling_params": {"max_new_tokens": 10, "n": 40},  # 40 x 310 x 21 = 260,400
    }
    error = error_of(http.post("/generate", json=body))
    assert "max_logprob_entries" in error["message"] and "260400" in error["message"]


def test_health_answers_while_the_largest_allowed_response_is_built(server, http, http_engine):
    """30 samples x 310 positions x 21 entries = 195,300 logprob entries (the limit is
    200,000): about 7 MB of JSON. /health is polled the whole time; the worst wait
    is bounded well under the 7.5 s it once took (benchmarks/bench_hostile_http.py
    measures it against the 100 ms target)."""
    body = {
        "input_ids": list(range(1000, 1300)),
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 20,
        "sampling_params": {"max_new_tokens": 10, "n": 30, "temperature": 0.0, "ignore_eos": True},
    }
    waits: list[float] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=server.base_url, timeout=30) as client:
            while not done.is_set():
                start = time.perf_counter()
                assert client.get("/health").status_code == 200
                waits.append(time.perf_counter() - start)
                time.sleep(0.01)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        # the measure is /health's waits; building the response may take a while
        response = http.post("/generate", json=body, timeout=180)
    finally:
        done.set()
        poller.join()
    assert response.status_code == 200
    outputs = response.json()
    assert len(outputs) == 30 and len(response.content) > 5_000_000
    meta = outputs[0]["meta_info"]
    assert len(meta["input_top_logprobs"]) == 300 and len(meta["output_top_logprobs"]) == 10
    assert len(waits) > 5 and max(waits) < 1.0, max(waits)
    wait_idle(http_engine)


# ---- 3. JSON nested 100,000 deep in a string (500 RecursionError) -------------------------


@pytest.mark.parametrize("field", ["json_schema", "structural_tag"])
def test_deeply_nested_json_text_on_generate_is_a_400(http, field):
    deep = "[" * 100_000 + "]" * 100_000
    response = http.post("/generate", json={"text": "Hi", "sampling_params": {field: deep}})
    assert error_of(response)["param"] == field


def test_deeply_nested_tool_call_arguments_are_a_400(http):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * 100_000}}
    messages = [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    error = error_of(http.post("/v1/chat/completions", json={**CHAT, "messages": messages}))
    assert error["param"] == "messages[1].tool_calls[0].function.arguments"
    assert error["code"] == "request_limit_exceeded" and "max_json_depth" in error["message"]


def test_a_deeply_nested_body_is_a_400(http):
    body = '{"model": "default", "messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response = http.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert error_of(response)["code"] == "json_invalid"


# ---- 4. sampling values that broke the model pass (finish "abort", id 49152) -------------


@pytest.mark.parametrize("value", [1e-300, 0.0, 1e300])
def test_an_extreme_repetition_penalty_is_a_400(http, value):
    params = {"repetition_penalty": value, "temperature": 1.0, "max_new_tokens": 4}
    response = http.post("/generate", json={"text": "Hi", "sampling_params": params})
    assert error_of(response)["param"] == "repetition_penalty"


def test_a_temperature_past_100_is_a_400(http):
    response = http.post(
        "/generate", json={"text": "Hi", "sampling_params": {"temperature": 1e300}}
    )
    assert error_of(response)["param"] == "temperature"


@pytest.mark.parametrize("top_p", [1e-46, 1e-300, 5e-324])
def test_a_top_p_that_rounds_to_zero_keeps_the_most_likely_token(http, http_engine, top_p):
    greedy = http.post("/generate", json={"text": "The sky is", "sampling_params": GREEDY}).json()
    params = {**GREEDY, "temperature": 1.0, "top_p": top_p}
    out = http.post("/generate", json={"text": "The sky is", "sampling_params": params}).json()
    assert out["meta_info"]["finish_reason"]["type"] != "abort"
    assert out["output_ids"] == greedy["output_ids"]
    chat = http.post("/v1/chat/completions", json={**CHAT, "top_p": top_p, "temperature": 1.0})
    assert chat.status_code == 200 and chat.json()["choices"][0]["finish_reason"] != "abort"
    wait_idle(http_engine)


# ---- 5. a request that can never fit got 503 + Retry-After --------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**CHAT, "n": 9}),
        ("/v1/chat/completions", {**CHAT, "n": 1_000_000}),
        ("/v1/completions", {"model": "default", "prompt": ["a"] * 9, "max_tokens": 1}),
        ("/generate", {"text": ["a"] * 1000, "sampling_params": {"max_new_tokens": 1}}),
        ("/generate", {"text": "a", "sampling_params": {"n": 9}}),
    ],
)
def test_more_samples_than_the_server_ever_admits_is_a_400(http_engine, path, body):
    with running_server(http_engine, max_queued_requests=8) as small:
        error = error_of(httpx.post(small.base_url + path, json=body, timeout=60))
        assert error["code"] == "request_limit_exceeded"
        assert "max_queued_requests" in error["message"] and "retry" not in error["message"]
        wait_released(small.state)


# ---- 6. guessable request ids (req-1, req-2, ...) ------------------------------------------


def test_request_ids_are_random_and_an_unknown_id_is_a_404(http):
    ids = [
        http.post("/generate", json={"text": "a", "sampling_params": GREEDY}).json() for _ in "ab"
    ]
    rids = [out["meta_info"]["id"] for out in ids]
    assert rids[0] != rids[1] and all(len(r) == 32 and int(r, 16) >= 0 for r in rids)
    for rid in ("req-1", rids[0], "0" * 32):  # never issued, or already finished
        error = error_of(http.post("/abort_request", json={"rid": rid}), 404)
        assert error["param"] == "rid" and error["code"] == "request_not_found"


# ---- 7. idle and slow connections held open forever --------------------------------------


def raw(base_url: str) -> socket.socket:
    url = urlsplit(base_url)
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Until the server closes the connection (the socket's timeout bounds the wait)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.fixture(scope="module")
def strict_server(http_engine):
    with running_server(http_engine, header_read_timeout_s=0.5, body_read_timeout_s=1.0) as s:
        yield s


def test_partial_headers_get_a_408_and_the_connection_closed(strict_server):
    with raw(strict_server.base_url) as sock:
        start = time.monotonic()
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-")
        reply = read_all(sock)
    assert reply.startswith(b"HTTP/1.1 408 ") and b'"code":"request_timeout"' in reply
    assert 0.4 < time.monotonic() - start < 5


def test_a_silent_connection_is_closed(strict_server):
    with raw(strict_server.base_url) as sock:
        start = time.monotonic()
        assert read_all(sock) == b""
    assert time.monotonic() - start < 5


def test_an_idle_keep_alive_connection_that_starts_a_request_is_held_to_the_deadline(
    strict_server,
):
    with raw(strict_server.base_url) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /hea")  # disarms uvicorn's keep-alive timer
        start = time.monotonic()
        assert read_all(sock).startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - start < 5


def test_a_body_sent_byte_by_byte_gets_a_408(strict_server):
    head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with raw(strict_server.base_url) as sock:
        start = time.monotonic()
        sock.sendall(head + b"Content-Length: 100\r\n\r\n{")
        for _ in range(3):
            time.sleep(0.4)
            sock.sendall(b" ")
        reply = read_all(sock)
    assert reply.startswith(b"HTTP/1.1 408 ") and b"did not arrive within 1 s" in reply
    assert time.monotonic() - start < 5


def test_shutdown_answers_a_slow_upload_at_once(http_engine):
    """uvicorn would wait for the body (here up to the 60 s deadline), then send a
    plain-text 500; the server now answers 503 and stops within a second or so."""
    head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
    with running_server(http_engine) as running:
        with raw(running.base_url) as sock:
            sock.sendall(head)
            time.sleep(0.3)
            start = time.monotonic()
            running.server.should_exit = True
            reply = read_all(sock)
        assert reply.startswith(b"HTTP/1.1 503 ") and b"shutting down" in reply
    assert time.monotonic() - start < 5  # leaving the block joined the stopped server


# ---- 8. /generate coerced types ("stream": "yes" streamed) --------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stream", "yes"),
        ("input_ids", ["1", "2"]),
        ("input_ids", [1.0, 2.0]),
        ("top_logprobs_num", "2"),
        ("return_logprob", 1),
    ],
)
def test_generate_is_strict_about_types(http, field, value):
    body = {"input_ids": [1, 2], field: value}
    assert error_of(http.post("/generate", json=body))["param"].startswith(field)
