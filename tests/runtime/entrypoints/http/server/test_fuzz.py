"""Hostile and malformed bodies on every POST route: never a 5xx, never a hang, and the
server keeps serving (hypothesis, bounded example counts). Besides random bodies, the
shapes that once killed or froze the server: long and many stop strings,
extreme floats in every sampling field, deep nesting in every JSON-in-a-string field,
huge ``n`` and batches, random ids to ``/abort_request``; across them the process's
resident memory stays bounded.

The engine behind this server has a 192-token context and max_n 4, so a body that
happens to be valid generates little: every example answers within seconds."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.runtime.entrypoints.http.conftest import running_server, wait_idle

# Each route's own field names (bodies mix them with strangers).
ROUTES = {
    "/v1/chat/completions": (
        "model messages max_tokens max_completion_tokens temperature top_p n stop seed stream "
        "stream_options logprobs top_logprobs response_format regex ebnf choices tools "
        "presence_penalty"
    ).split(),
    "/v1/completions": (
        "model prompt max_tokens echo logprobs n stream temperature stop ignore_eos min_tokens"
    ).split(),
    "/generate": (
        "text input_ids sampling_params return_logprob logprob_start_len top_logprobs_num "
        "stream return_text_in_logprobs"
    ).split(),
    "/tokenize": ["text", "add_special_tokens"],
    "/detokenize": ["tokens", "skip_special_tokens"],
    "/abort_request": ["rid"],
    "/flush_cache": [],
}
# Bodies that once found a 5xx: always tried, besides the generated ones.
KNOWN = {
    "/v1/completions": [
        {"model": "default", "prompt": [10**10]},
        {"model": "default", "prompt": [[1, 10**30]]},
    ],
    "/generate": [{"input_ids": [10**30]}, {"input_ids": [[1, 2], [-1]]}],
    "/detokenize": [{"tokens": [10**30]}],
}
NESTED_KEYS = "role content type max_new_tokens n json_schema schema regex temperature".split()
TIMEOUT_S = 60.0

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["default", "user", "assistant", "json_schema", "[a-z]+", "(", "\ud800"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.one_of(st.sampled_from(NESTED_KEYS), st.text(max_size=8)), inner, max_size=4
        ),
    ),
    max_leaves=12,
)
token_ids = st.lists(st.integers(min_value=-(2**70), max_value=2**70), max_size=4)


def _encode(body: object) -> bytes:
    return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")


def bodies(route: str):
    """JSON objects over the route's field names (and strangers), token-id lists
    included; the known hostile bodies; raw bytes."""
    fields = ROUTES[route]
    keys = st.sampled_from([*fields, "unknown", ""]) if fields else st.text(max_size=8)
    field_values = st.one_of(values, token_ids, st.lists(token_ids, max_size=3))
    objects = st.dictionaries(keys, field_values, max_size=6).map(_encode)
    known = [_encode(b) for b in KNOWN.get(route, [])]
    raw = st.sampled_from([b"", b"[]", b"null", b"{", b'{"a":', *known])
    return st.one_of(objects, st.binary(max_size=64), raw)


@pytest.fixture(scope="module")
def server(default_model_dir):
    from radixlm import Engine

    engine = Engine(model_path=str(default_model_dir), dtype="float32", context_length=192, max_n=4)
    with running_server(engine) as running:
        yield running
    engine.shutdown()


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_no_body_gets_a_5xx_and_the_server_keeps_serving(server, route):
    client = httpx.Client(base_url=server.base_url, timeout=TIMEOUT_S)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=bodies(route))
    def post(body: bytes) -> None:
        response = client.post(route, content=body, headers={"content-type": "application/json"})
        assert response.status_code < 500, (body, response.status_code, response.text)
        if response.status_code >= 400:
            error = response.json()["error"]
            assert isinstance(error["message"], str) and error["message"]
            assert set(error) == {"message", "type", "param", "code"}

    try:
        for body in KNOWN.get(route, []):  # first, whatever hypothesis draws
            post.hypothesis.inner_test(_encode(body))
        post()
        wait_idle(server.state.engine, timeout_s=TIMEOUT_S)
        ok = client.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
        assert ok.status_code == 200 and len(ok.json()["output_ids"]) <= 2
    finally:
        client.close()


# (/health_generate is left out: its 503 is a legitimate answer on a slow machine)
GET_ROUTES = ["/v1/models", "/server_info", "/get_server_info", "/get_model_info", "/health",
              "/metrics", "/flush_cache", "/no/such/route"]  # fmt: skip


@pytest.mark.parametrize("route", GET_ROUTES)
def test_get_routes_shrug_off_stray_queries_and_bodies(server, route):
    client = httpx.Client(base_url=server.base_url, timeout=TIMEOUT_S)

    @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        query=st.dictionaries(st.text(max_size=8), st.text(max_size=16), max_size=3),
        body=st.binary(max_size=32),
        method=st.sampled_from(["GET", "DELETE", "PUT", "PATCH"]),
    )
    def call(query: dict, body: bytes, method: str) -> None:
        response = client.request(method, route, params=query, content=body)
        assert response.status_code < 500, (method, query, body, response.text)
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    try:
        call()
        assert client.get("/health").status_code == 200
    finally:
        client.close()


# ---- the hostile shapes ---------------------------------------------------------

SAMPLING_FLOATS = "temperature top_p min_p repetition_penalty frequency_penalty presence_penalty"
EXTREME_FLOATS = [0.0, -0.0, 5e-324, 1e-300, 1e-46, 1e-38, 1e-6, 1.0, 2.0, 100.0, 3.4e38, 1e300]
# Bounded so that the worst accepted body still answers within seconds on 2 cores.
RSS_GROWTH_BOUND_MB = 400


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _deep_schema(depth: int) -> dict:
    """An array of arrays of ... of integers: JSON nested ``depth`` objects deep."""
    schema: dict = {"type": "integer"}
    for _ in range(depth - 1):
        schema = {"type": "array", "items": schema}
    return schema


stop_lists = st.one_of(
    st.lists(st.integers(1, 3000).map(lambda k: "y" * k), min_size=1, max_size=8),
    st.lists(st.text(min_size=1, max_size=3), min_size=1, max_size=300),
    st.integers(1000, 1_000_000).map(lambda k: ["y" * k]),
)
extreme = st.sampled_from(EXTREME_FLOATS) | st.sampled_from(EXTREME_FLOATS).map(lambda x: -x)
deep_json = st.integers(100, 20_000).map(_deep)
huge_n = st.sampled_from([5, 9, 300, 10**6, 2**40])


@st.composite
def sampling_params(draw):
    params = {"max_new_tokens": draw(st.integers(0, 4))}
    for name in draw(st.lists(st.sampled_from(SAMPLING_FLOATS.split()), max_size=3)):
        params[name] = draw(extreme)
    if draw(st.booleans()):
        params["stop"] = draw(stop_lists)
    if draw(st.booleans()):
        params["n"] = draw(huge_n)
    if draw(st.booleans()):
        params[draw(st.sampled_from(["json_schema", "structural_tag"]))] = draw(deep_json)
    return params


@st.composite
def hostile_generate(draw):
    batch = draw(st.sampled_from([1, 1, 3, 1000]))
    text = "Hi" if batch == 1 else ["Hi"] * batch
    body = {"text": text, "sampling_params": draw(sampling_params())}
    if draw(st.booleans()):
        body["return_logprob"] = True
        body["logprob_start_len"] = draw(st.sampled_from([-1, 0, 5]))
        body["top_logprobs_num"] = draw(st.sampled_from([0, 20, 21, 49151, 10**9]))
    body["stream"] = draw(st.booleans())
    return "/generate", body


@st.composite
def hostile_chat(draw):
    params = draw(sampling_params())
    body = {"model": "default", "max_tokens": max(params.pop("max_new_tokens"), 1)}
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "stop", "n"):
        if name in params:
            body[name] = params[name]
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    if draw(st.booleans()):
        call["function"]["arguments"] = draw(deep_json)
    body["messages"] = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
        {"role": "user", "content": "Go"},
    ]
    if draw(st.booleans()):
        schema = _deep_schema(draw(st.integers(1, 300)))
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": schema},
        }
    body["logprobs"] = draw(st.booleans())
    if body["logprobs"]:
        body["top_logprobs"] = draw(st.sampled_from([0, 20, 21]))
    return "/v1/chat/completions", body


abort_bodies = st.builds(
    lambda rid: ("/abort_request", {"rid": rid}),
    st.one_of(
        st.text(max_size=40),
        st.integers(0, 2**128).map(lambda i: f"{i:032x}"[:32]),
        st.integers(0, 100).map(lambda i: f"req-{i}"),
    ),
)


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def _post_hostile(client: httpx.Client, route: str, body: dict, statuses: list[int]) -> None:
    """Posts ``body``: never a 5xx, and every refusal OpenAI-shaped."""
    response = client.post(route, json=body)
    statuses.append(response.status_code)
    assert response.status_code < 500, (route, str(body)[:300], response.text[:300])
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def _assert_recovered(server, client, baseline_mb: float, statuses: list[int], bound_mb: int):
    """Once all is answered: memory within ``bound_mb`` of before, both sides of the
    limits reached, and the server still serving."""
    wait_idle(server.state.engine, timeout_s=TIMEOUT_S)
    growth = _rss_mb() - baseline_mb
    assert growth < bound_mb, f"resident memory grew {growth:.0f} MB"
    assert 200 in statuses and 400 in statuses
    ok = client.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) <= 2


def test_hostile_shapes_get_no_5xx_and_memory_stays_bounded(server):
    client = httpx.Client(base_url=server.base_url, timeout=TIMEOUT_S)
    warm = client.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert warm.status_code == 200
    baseline = _rss_mb()
    statuses: list[int] = []

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(hostile_generate(), hostile_chat(), abort_bodies))
    def post(case) -> None:
        _post_hostile(client, *case, statuses)

    try:
        post()
        _assert_recovered(server, client, baseline, statuses, RSS_GROWTH_BOUND_MB)
    finally:
        client.close()


# ---- the hostile shapes of the second probe --------------------------------------

MAX_BODY = 8 * 1024 * 1024  # the default max_request_body_bytes
# What the largest accepted or refused body may leave behind once it is answered.
RSS_RETURN_BOUND_MB = 300
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
body_sizes = st.sampled_from([1, 1000, 300_000, MAX_BODY // 2, MAX_BODY - 400])
counted_repeats = st.sampled_from(
    ["a{3}", "a{5000}", "a{100000}", "a{1000000}", "(a{1000}){1000}", "(ab|c{50}){99}d"]
)


def _chat(**fields) -> dict:
    return {"model": "default", "messages": [{"role": "user", "content": "Hi"}], **fields}


second_probe = st.one_of(
    st.builds(  # the quadratic reasoning splitter
        lambda k: (
            "/separate_reasoning",
            {"text": "<think>" * (k // 8), "reasoning_parser": "deepseek-r1"},
        ),
        body_sizes,
    ),
    st.builds(  # a prompt just under the body limit, tokenized whole before the context check
        lambda k: (
            "/v1/chat/completions",
            {**_chat(max_tokens=2), "messages": [{"role": "user", "content": "a" * k}]},
        ),
        body_sizes,
    ),
    st.builds(
        lambda k: ("/v1/completions", {"model": "default", "prompt": "a" * k, "max_tokens": 2}),
        body_sizes,
    ),
    st.builds(
        lambda k: ("/generate", {"text": "a" * k, "sampling_params": {"max_new_tokens": 2}}),
        body_sizes,
    ),
    st.builds(  # many Responses input items, many tools
        lambda k: (
            "/v1/responses",
            {
                "model": "default",
                "max_output_tokens": 2,
                "input": [{"role": "user", "content": "Hi"}] * k,
            },
        ),
        st.sampled_from([1, 3000, 150_000]),
    ),
    st.builds(
        lambda k: ("/v1/chat/completions", _chat(max_tokens=2, tools=[TOOL] * k)),
        st.sampled_from([1, 129, 2000]),
    ),
    st.builds(  # counted repeats: in a stop regex, and as the constraint itself
        lambda p, field: (
            "/generate",
            {"text": "Hi", "sampling_params": {"max_new_tokens": 2, field: p}},
        ),
        counted_repeats,
        st.sampled_from(["stop_regex", "regex"]),
    ),
    st.builds(
        lambda n: ("/v1/chat/completions", _chat(max_tokens=1, n=n)),
        st.sampled_from([4, 5, 65, 256]),
    ),
    st.builds(
        lambda b: (
            "/v1/completions",
            {"model": "default", "prompt": "Hi", "max_tokens": 1, "best_of": b},
        ),
        st.sampled_from([0, -1, 1, 2]),
    ),
    st.builds(  # fields that were echoed back whole
        lambda k: (
            "/v1/responses",
            {
                "model": "default",
                "input": "Hi",
                "max_output_tokens": 1,
                "user": "u" * k,
                "metadata": {"k": "v" * k},
            },
        ),
        st.sampled_from([1, 512, 100_000]),
    ),
)


def test_second_probe_shapes_get_no_5xx_and_their_memory_goes_back(server):
    """Every shape the second probe found a stall or a memory hold with: no 5xx (nor a
    503: each is either served or can never be), and once all are answered the process
    holds at most RSS_RETURN_BOUND_MB more than before."""
    client = httpx.Client(base_url=server.base_url, timeout=TIMEOUT_S)
    warm = client.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert warm.status_code == 200
    baseline = _rss_mb()
    statuses: list[int] = []

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=second_probe)
    def post(case) -> None:
        _post_hostile(client, *case, statuses)

    try:
        post()
        _assert_recovered(server, client, baseline, statuses, RSS_RETURN_BOUND_MB)
    finally:
        client.close()
