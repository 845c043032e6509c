"""The OpenAI-compatible routes over real HTTP with the official client, on the
default model; greedy outputs must equal the in-process engine's."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.runtime.entrypoints.http.conftest import (
    sse_events,
    wait_idle,
    wait_released,
)

MESSAGES = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=60)


def engine_chat(engine, messages, max_new_tokens):
    prompt = engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    return engine.generate(prompt, {"temperature": 0, "max_new_tokens": max_new_tokens})


def test_chat_greedy_equals_the_engine(client, http_engine):
    reply = client.chat.completions.create(
        model="default", messages=MESSAGES, max_tokens=12, temperature=0
    )
    expected = engine_chat(http_engine, MESSAGES, 12)
    assert reply.choices[0].message.content == expected["text"]
    assert reply.choices[0].message.role == "assistant"
    assert reply.object == "chat.completion" and reply.model == "default"
    assert reply.usage.completion_tokens == expected["meta_info"]["completion_tokens"]
    assert reply.usage.prompt_tokens == expected["meta_info"]["prompt_tokens"]
    finish = expected["meta_info"]["finish_reason"]["type"]
    assert reply.choices[0].finish_reason == finish


def test_model_name_is_accepted_and_listed(client, server):
    models = [m.id for m in client.models.list().data]
    assert models == ["default", server.state.model_name]
    reply = client.chat.completions.create(
        model=server.state.model_name, messages=MESSAGES, max_tokens=2, temperature=0
    )
    assert reply.model == server.state.model_name


def test_streaming_joins_to_the_same_text_and_reports_usage(client, http_engine):
    stream = client.chat.completions.create(
        model="default",
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    expected = engine_chat(http_engine, MESSAGES, 12)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected["text"]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == expected["meta_info"]["finish_reason"]["type"]
    assert all(f is None for f in finishes[:-1])
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.completion_tokens == expected["meta_info"]["completion_tokens"]
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens


def test_raw_sse_framing_ends_with_done(server):
    body = {"model": "default", "messages": MESSAGES, "max_tokens": 3, "stream": True}
    response = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert {p["object"] for p in parsed} == {"chat.completion.chunk"}
    assert len({p["id"] for p in parsed}) == 1


class City(BaseModel):
    name: str = Field(max_length=16)
    capital: bool


def test_parse_with_a_pydantic_model(client):
    completion = client.chat.completions.parse(
        model="default",
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        response_format=City,
        max_tokens=60,
        temperature=0,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, City)
    assert City.model_validate_json(completion.choices[0].message.content) == parsed


def test_json_schema_output_validates(client):
    schema = {
        "type": "object",
        "properties": {
            "colour": {"type": "string", "enum": ["red", "green", "blue"]},
            "count": {"type": "integer"},
        },
        "required": ["colour", "count"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model="default",
        messages=MESSAGES,
        max_tokens=30,
        temperature=0.7,
        seed=3,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "c", "schema": schema, "strict": True},
        },
    )
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_a_lenient_schema_reports_what_it_dropped(client):
    # contains: enforced nowhere (uniqueItems is: below)
    item = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
            "maximum": 9}}, "required": ["n"], "additionalProperties": False}  # fmt: skip
    schema = {"type": "array", "items": item, "contains": {"required": ["n"]}, "maxItems": 2}
    body = {
        "model": "default",
        "messages": MESSAGES,
        "max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    }
    refused = client.chat.completions.with_raw_response.create  # the SDK raises on 400
    with pytest.raises(openai.BadRequestError, match="contains at #"):
        refused(**body)
    reply = client.chat.completions.create(**body, extra_body={"json_schema_lenient": True})
    (warning,) = reply.choices[0].model_extra["grammar_warnings"]
    assert "contains at #" in warning
    assert len(json.loads(reply.choices[0].message.content)) <= 2
    scalars = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
               "uniqueItems": True, "minItems": 4, "maxItems": 4}  # fmt: skip
    body["response_format"]["json_schema"]["schema"] = scalars
    reply = client.chat.completions.create(**body, temperature=1.0, seed=2)
    assert "grammar_warnings" not in (reply.choices[0].model_extra or {})
    values = json.loads(reply.choices[0].message.content)
    assert len(values) == len(set(values)) == 4


def test_json_object_regex_and_choices(client):
    reply = client.chat.completions.create(
        model="default",
        messages=MESSAGES,
        max_tokens=30,
        response_format={"type": "json_object"},
        temperature=0,
    )
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    reply = client.chat.completions.create(
        model="default", messages=MESSAGES, max_tokens=8, extra_body={"regex": "[0-9]{3}"}
    )
    assert len(reply.choices[0].message.content) == 3
    assert reply.choices[0].message.content.isdigit()
    reply = client.chat.completions.create(
        model="default",
        messages=MESSAGES,
        max_tokens=8,
        extra_body={"choices": ["red", "blue"]},
    )
    assert reply.choices[0].message.content in ("red", "blue")


def test_n_samples_with_seed_are_reproducible(client):
    def ask():
        reply = client.chat.completions.create(
            model="default", messages=MESSAGES, max_tokens=6, temperature=1.0, n=3, seed=11
        )
        return reply

    first, second = ask(), ask()
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.message.content for c in first.choices] == [c.message.content for c in second.choices]
    assert (
        first.usage.completion_tokens
        == sum(len(c.logprobs.content) if c.logprobs else 0 for c in first.choices)
        or first.usage.completion_tokens > 0
    )


def test_logprobs_content_shape_and_greedy_top(client):
    reply = client.chat.completions.create(
        model="default",
        messages=MESSAGES,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(bytes(e.bytes).decode("utf-8", "replace") for e in content) == (
        reply.choices[0].message.content
    )
    for entry in content:
        assert len(entry.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
        assert entry.token == entry.top_logprobs[0].token


def test_completions_echo_and_logprobs(client, http_engine):
    prompt = "The capital of France is"
    reply = client.completions.create(
        model="default",
        prompt=[prompt, "1, 2, 3,"],
        max_tokens=4,
        temperature=0,
        echo=True,
        logprobs=1,
    )
    expected = http_engine.generate(prompt, {"temperature": 0, "max_new_tokens": 4})
    first = reply.choices[0]
    assert first.text == prompt + expected["text"]
    num_prompt = expected["meta_info"]["prompt_tokens"]
    assert len(first.logprobs.tokens) == num_prompt + 4
    assert first.logprobs.token_logprobs[0] is None
    assert "".join(first.logprobs.tokens) == first.text
    assert [c.index for c in reply.choices] == [0, 1]


def test_completions_stream(server, http_engine):
    body = {
        "model": "default",
        "prompt": "Once upon a time",
        "max_tokens": 6,
        "temperature": 0,
        "stream": True,
    }
    response = httpx.post(server.base_url + "/v1/completions", json=body, timeout=60)
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    expected = http_engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 6})
    assert text == expected["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_64_concurrent_streams_complete_and_leak_nothing(server, http_engine):
    prompts = [f"Count from {i}:" for i in range(64)]
    # one batch: the engine's tokens do not depend on their batch (test_engine.py)
    expected = [
        o["text"] for o in http_engine.generate(prompts, {"temperature": 0, "max_new_tokens": 8})
    ]

    async def one(client, prompt):
        body = {
            "model": "default",
            "prompt": prompt,
            "max_tokens": 8,
            "temperature": 0,
            "stream": True,
        }
        text = ""
        async with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    text += json.loads(line[6:])["choices"][0]["text"]
        return text

    async def all_of_them():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    assert asyncio.run(all_of_them()) == expected
    wait_idle(http_engine)
    info = httpx.get(server.base_url + "/server_info").json()["internal_states"][0]
    assert info["kv_used"] == 0 and info["num_running"] == 0 and info["num_waiting"] == 0
    wait_released(server.state)


def test_disconnect_mid_stream_aborts_and_frees(server, http_engine):
    body = {
        "model": "default",
        "prompt": "Tell a long story:",
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }
    before = http_engine.get_stats().num_generated_tokens
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            events = (line for line in response.iter_lines() if line)
            for _ in range(3):
                assert next(events).startswith("data: ")
    # the client is gone: its request must stop long before 2000 tokens
    wait_idle(http_engine, timeout_s=10)
    generated = http_engine.get_stats().num_generated_tokens - before
    assert generated < 500
    wait_released(server.state)


def test_disconnect_of_a_non_streamed_request_aborts_it(server, http_engine):
    body = {
        "model": "default",
        "prompt": "Tell a long story:",
        "max_tokens": 2000,
        "ignore_eos": True,
    }
    before = http_engine.get_stats().num_generated_tokens
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/completions", json=body, timeout=1.0)
    wait_idle(http_engine, timeout_s=10)
    assert http_engine.get_stats().num_generated_tokens - before < 500


def _post(server, path, body, **kwargs):
    return httpx.post(server.base_url + path, timeout=60, **kwargs, **body)


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"content": b"{not json"}, 400, None, "json_invalid"),
        (
            {"json": {"model": "default", "messages": MESSAGES, "max_tokens": "5"}},
            400,
            "max_tokens",
            None,
        ),
        (
            {"json": {"model": "default", "messages": MESSAGES, "temperature": 101}},
            400,
            "temperature",
            None,
        ),
        ({"json": {"model": "default"}}, 400, "messages", None),
        ({"json": {"model": "gpt-9", "messages": MESSAGES}}, 404, "model", "model_not_found"),
        (
            {"json": {"model": "default", "messages": MESSAGES, "regex": "(["}},
            400,
            "regex",
            "invalid_grammar",
        ),
        (
            {"json": {"model": "default", "messages": MESSAGES, "ebnf": "root ::= nope"}},
            400,
            "ebnf",
            "invalid_grammar",
        ),
        (
            {
                "json": {
                    "model": "default",
                    "messages": MESSAGES,
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {
                            "name": "x",
                            "schema": {"type": "integer", "minimum": 5, "maximum": 1},
                        },
                    },
                }
            },
            400,
            "response_format",
            "invalid_grammar",
        ),
        (
            {"json": {"model": "default", "messages": MESSAGES, "max_tokens": 9000}},
            400,
            "max_tokens",
            "context_length_exceeded",
        ),
        (
            {"json": {"model": "default", "messages": MESSAGES, "n": 65}},
            400,
            "n",
            "request_limit_exceeded",
        ),
        ({"json": {"model": "default", "messages": MESSAGES, "n": 0}}, 400, "n", None),
        (  # the engine's one limit (max_top_logprobs_num, 20 by default), named as sent
            {
                "json": {
                    "model": "default",
                    "messages": MESSAGES,
                    "logprobs": True,
                    "top_logprobs": 21,
                }
            },
            400,
            "top_logprobs",
            "request_limit_exceeded",
        ),  # fmt: skip
        (
            {"json": {"model": "default", "messages": MESSAGES, "tools": [{"type": "retrieval"}]}},
            400,
            "tools.0.type",
            None,
        ),
    ],
)
def test_bad_requests_get_openai_errors(server, http_engine, body, status, param, code):
    headers = {"content-type": "application/json"}
    response = _post(server, "/v1/chat/completions", body, headers=headers)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] == param and error["code"] == code
    wait_idle(http_engine)  # nothing queued, the engine still serves
    ok = _post(
        server, "/v1/completions", {"json": {"model": "default", "prompt": "a", "max_tokens": 1}}
    )
    assert ok.status_code == 200


def test_streamed_bad_request_is_a_4xx_before_streaming(server):
    body = {"model": "default", "messages": MESSAGES, "regex": "((", "stream": True}
    response = _post(server, "/v1/chat/completions", {"json": body})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "regex"


def test_unknown_route_and_method(server):
    assert httpx.get(server.base_url + "/v1/nothing").status_code == 404
    response = httpx.get(server.base_url + "/v1/chat/completions")
    assert response.status_code == 405 and "error" in response.json()
