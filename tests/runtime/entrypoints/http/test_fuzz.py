"""Hostile and malformed bodies on every POST route: never a 5xx, never a hang, and the
server keeps serving (hypothesis, bounded example counts).

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
