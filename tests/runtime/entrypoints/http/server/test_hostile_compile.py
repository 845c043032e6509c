"""Grammar compiles cannot stall each other, over real HTTP
on the default model: a small constraint answers while slow compiles hold the general
workers, a compile's limit counts from the request's arrival, and a constraint past a
cheap limit (depth, enum values, size, counted repeats) is refused before it queues."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest

from tests.runtime.entrypoints.http.conftest import running_server, wait_idle

TIMEOUT_S = 3.0  # the test engine's grammar_compile_timeout: tests wait for it, not 10 s
CHAT = {"model": "default", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def compile_engine(default_model_dir):
    from radixlm import Engine

    engine = Engine(
        model_path=str(default_model_dir),
        dtype="float32",
        max_total_tokens=4096,
        grammar_compile_timeout=TIMEOUT_S,
    )
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def http(compile_engine):
    with running_server(compile_engine) as server:
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            yield client


def slow_regex() -> str:
    """A regex under every cheap limit whose outlines FSM takes minutes (never cached)."""
    return f"{uuid.uuid4().hex[:6]}.{{0,5000}}"


def timed_post(http: httpx.Client, body: dict, results: dict, key: str) -> None:
    start = time.monotonic()
    response = http.post("/v1/chat/completions", json=body)
    results[key] = (response, time.monotonic() - start)


def in_background(http: httpx.Client, bodies: dict[str, dict]) -> tuple[list, dict]:
    results: dict = {}
    threads = [
        threading.Thread(target=timed_post, args=(http, body, results, key))
        for key, body in bodies.items()
    ]
    for thread in threads:
        thread.start()
    return threads, results


def error_of(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def assert_timed_out(response: httpx.Response, param: str) -> None:
    error = error_of(response)
    assert error["param"] == param and error["code"] == "invalid_grammar"
    assert f"took over {TIMEOUT_S:g} s (grammar_compile_timeout" in error["message"]


def warm_compiles(http: httpx.Client) -> None:
    """The fast lane's worker and a general one are up, and the server process has built
    each backend it loads grammars with (their start is not what is timed)."""
    for body in (
        lambda: {"guided_regex": "[0-9]{3}"},  # small
        lambda: {"guided_regex": f"{uuid.uuid4().hex[:4]}[0-9]{{40}}"},  # not small
        lambda: {"guided_json": {"type": "boolean"}},  # llguidance
        lambda: {"tools": [TOOL], "tool_choice": "required"},  # xgrammar
    ):
        for _ in range(3):  # a fresh worker's first compile on a loaded machine may overrun
            response = http.post("/v1/chat/completions", json={**CHAT, **body()})
            if response.status_code == 200:
                break
        assert response.status_code == 200, response.text


# ---- 3. a trivial schema waited 17.4 s behind two slow regexes --------------------------


def test_small_constraints_answer_while_two_slow_compiles_run(http, compile_engine):
    warm_compiles(http)
    slow = {f"slow{i}": {**CHAT, "guided_regex": slow_regex()} for i in range(2)}
    threads, results = in_background(http, slow)
    time.sleep(0.5)  # both are compiling (or queued) now
    small = {
        "schema": {**CHAT, "guided_json": {"type": "integer", "maximum": int(time.time())}},
        "tools": {**CHAT, "tools": [{**TOOL, "function": {**TOOL["function"],
                                                           "name": f"f{uuid.uuid4().hex[:6]}"}}],
                  "tool_choice": "required"},
    }  # fmt: skip
    for key, body in small.items():
        timed_post(http, body, results, key)
        response, seconds = results[key]
        assert response.status_code == 200, response.text
        # before: 17.4 s (a schema), 7.9-11 s (tool calls) behind the slow compiles
        assert seconds < 3.0, f"{key} took {seconds:.1f} s beside two slow compiles"
        if key == "schema":
            assert all(t.is_alive() for t in threads)  # it did not wait for them
    for thread in threads:
        thread.join()
    for key in slow:
        response, seconds = results[key]
        assert_timed_out(response, "guided_regex")
        assert seconds < TIMEOUT_S + 3.0
    wait_idle(compile_engine)


# ---- 3. the limit started when a worker took the job: 19.1 s for a 10 s limit -----------


def test_a_compile_queued_behind_busy_workers_is_refused_at_its_limit(http, compile_engine):
    warm_compiles(http)
    bodies = {f"slow{i}": {**CHAT, "guided_regex": slow_regex()} for i in range(3)}
    threads, results = in_background(http, bodies)  # 3 jobs for 2 general workers
    for thread in threads:
        thread.join()
    seconds = []
    for key in bodies:
        response, elapsed = results[key]
        assert_timed_out(response, "guided_regex")
        seconds.append(elapsed)
    never_started = [
        k for k in bodies if "never started" in results[k][0].json()["error"]["message"]
    ]
    assert never_started  # one waited for a worker and was refused at its own limit
    # all end near the same time: before, the third waited 2 s, a worker's start, 2 s more
    assert max(seconds) - min(seconds) < 1.5, seconds
    wait_idle(compile_engine)


# ---- 3. a refusal by depth came after 9.25 s of queueing, by enum size after 19.1 s -----
# ---- 4. a 50,000-alternative Lark grammar ran 23.3 s against the 10 s limit ----------------


def nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


LARK_50K = "start: " + " | ".join(f'"a{i}"' for i in range(50_000))


@pytest.mark.parametrize(
    ("field", "value", "code", "names"),
    [
        ("guided_json", nested(30), "invalid_grammar", "nested deeper than 24 levels"),
        ("guided_json", {"enum": list(range(100_000))}, "request_limit_exceeded",
         "grammar_max_enum_values"),
        ("guided_regex", "a{100000}", "request_limit_exceeded", "grammar_max_regex_size"),
        ("guided_grammar", LARK_50K, "request_limit_exceeded", "grammar_max_chars"),
    ],
    ids=["depth", "enum", "counted-repeat", "lark-50k"],
)  # fmt: skip
def test_a_constraint_past_a_cheap_limit_never_queues(http, compile_engine, field, value, code,
                                                      names):  # fmt: skip
    warm_compiles(http)
    slow = {f"slow{i}": {**CHAT, "guided_regex": slow_regex()} for i in range(2)}
    threads, results = in_background(http, slow)
    time.sleep(0.5)  # both general workers are busy for the whole limit
    timed_post(http, {**CHAT, field: value}, results, "refused")
    response, seconds = results["refused"]
    error = error_of(response)
    assert error["param"] == field and error["code"] == code and names in error["message"]
    assert seconds < 1.5, f"refused after {seconds:.1f} s"
    assert any(t.is_alive() for t in threads)  # it did not wait for them
    for thread in threads:
        thread.join()
    wait_idle(compile_engine)


def test_chats_keep_their_latency_while_a_lark_grammar_is_refused(http):
    """The 50,000-alternative grammar was compiled, then loaded on the event loop:
    a concurrent chat took 5 s instead of 0.2 s."""
    results: dict = {}
    thread = threading.Thread(
        target=timed_post, args=(http, {**CHAT, "guided_grammar": LARK_50K}, results, "lark")
    )
    thread.start()
    latencies = []
    while thread.is_alive() or not latencies:
        start = time.monotonic()
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
        latencies.append(time.monotonic() - start)
    thread.join()
    response, seconds = results["lark"]
    assert "grammar_max_chars" in error_of(response)["message"] and seconds < 1.5
    assert max(latencies) < 1.5, latencies
