"""Reasoning replies over HTTP, on a tiny random model whose tokenizer holds ``<think>``:
``reasoning_content`` in chat messages and deltas, a ``reasoning`` item in responses,
the answer (schema-valid JSON under a JSON schema) as the content."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from radixlm.runtime.entrypoints.engine import Engine
from radixlm.runtime.entrypoints.http.openai.reasoning_output import reasoning_plan
from radixlm.runtime.reasoning import Phase
from tests.runtime.entrypoints.http.conftest import running_server, sse_events, wait_idle
from tests.runtime.reasoning.model import ENGINE_OPTIONS, SCHEMA, write_reasoning_model

RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
CHAT = {
    "model": "default",
    "messages": [{"role": "user", "content": "Is it?"}],
    "temperature": 0,
    "max_tokens": 48,
    "max_reasoning_tokens": 6,
    "response_format": RESPONSE_FORMAT,
}


@pytest.fixture(scope="module")
def thinker(tmp_path_factory, default_model_dir):
    directory = write_reasoning_model(tmp_path_factory.mktemp("reasoning"), default_model_dir)
    engine = Engine(model_path=str(directory), **ENGINE_OPTIONS)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def server(thinker):
    with running_server(thinker) as running:
        yield running


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=120)


def test_chat_returns_the_reasoning_apart_and_the_answer_as_valid_json(server, thinker):
    response = post(server, "/v1/chat/completions", CHAT)
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert message["reasoning_content"] and "</think>" not in message["reasoning_content"]
    jsonschema.validate(json.loads(message["content"]), SCHEMA)
    # the budget's 6 reasoning tokens, counted apart as OpenAI's usage does
    usage = response.json()["usage"]
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 6}
    assert usage["completion_tokens"] > 6
    wait_idle(thinker)


def test_streamed_deltas_concatenate_to_the_unstreamed_message(server):
    whole = post(server, "/v1/chat/completions", CHAT).json()["choices"][0]["message"]
    response = post(server, "/v1/chat/completions", {**CHAT, "stream": True})
    chunks = [json.loads(e) for e in sse_events(response)[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (reasoning, content) == (whole["reasoning_content"], whole["content"])
    assert sum("reasoning_content" in d for d in deltas) > 1  # streamed as it came
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    last = json.loads(sse_events(post(server, "/v1/chat/completions", body))[-2])
    assert last["usage"]["completion_tokens_details"] == {"reasoning_tokens": 6}


def test_separate_reasoning_false_keeps_it_in_the_content(server):
    body = {**CHAT, "separate_reasoning": False}
    message = post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]
    assert "reasoning_content" not in message and "</think>" in message["content"]
    dropped = post(server, "/v1/chat/completions", {**CHAT, "include_reasoning": False})
    message = dropped.json()["choices"][0]["message"]
    assert message["reasoning_content"] is None
    jsonschema.validate(json.loads(message["content"]), SCHEMA)


def test_thinking_off_in_the_template_answers_at_once(server):
    body = {**CHAT, "chat_template_kwargs": {"enable_thinking": False}}
    del body["max_reasoning_tokens"]
    reply = post(server, "/v1/chat/completions", body).json()
    message = reply["choices"][0]["message"]
    assert message["reasoning_content"] is None
    jsonschema.validate(json.loads(message["content"]), SCHEMA)
    assert reply["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


def test_reasoning_effort_sets_the_budget_unless_one_is_given(server):
    """OpenAI's effort as a budget (radixlm.runtime.reasoning.effort): "none" answers
    at once; a request's own max_reasoning_tokens wins over its effort."""
    body = {k: v for k, v in CHAT.items() if k != "max_reasoning_tokens"}
    none = post(server, "/v1/chat/completions", {**body, "reasoning_effort": "none"}).json()
    assert none["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    assert none["choices"][0]["message"]["reasoning_content"] is None
    jsonschema.validate(json.loads(none["choices"][0]["message"]["content"]), SCHEMA)
    own = post(server, "/v1/chat/completions", {**CHAT, "reasoning_effort": "high"}).json()
    assert own["usage"]["completion_tokens_details"] == {"reasoning_tokens": 6}
    bad = post(server, "/v1/chat/completions", {**body, "reasoning_effort": "extreme"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"
    assert "none, minimal, low, medium, high" in bad.json()["error"]["message"]


def test_responses_reasoning_effort_none_answers_at_once(server):
    body = {"model": "default", "input": "Is it?", "max_output_tokens": 48, "temperature": 0}
    reply = post(
        server, "/v1/responses", {**body, "reasoning": {"effort": "none", "summary": "auto"}}
    )
    assert reply.status_code == 200, reply.text
    out = reply.json()
    assert out["usage"]["output_tokens_details"]["reasoning_tokens"] == 0
    assert [item["type"] for item in out["output"]] == ["message"]


def test_a_bad_reasoning_budget_is_a_400_naming_it(server):
    response = post(server, "/v1/chat/completions", {**CHAT, "max_reasoning_tokens": -1})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "max_reasoning_tokens"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 5}},
            "required": ["city"],
        },
    },
}


def test_tool_calls_are_read_from_the_answer_after_the_thinking(server):
    body = {**CHAT, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 100}
    del body["response_format"]
    message = post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]
    assert message["reasoning_content"] and "</think>" not in message["reasoning_content"]
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(
        json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"]
    )


RESPONSES = {
    "model": "default",
    "input": "Is it?",
    "temperature": 0,
    "max_output_tokens": 48,
    "max_reasoning_tokens": 6,
    "text": {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}},
}


def test_responses_emit_a_reasoning_item_before_the_message(server):
    body = post(server, "/v1/responses", RESPONSES).json()
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] == 6
    reasoning, message = body["output"]
    assert reasoning["type"] == "reasoning" and reasoning["summary"] == []
    thought = reasoning["content"][0]
    assert thought["type"] == "reasoning_text" and thought["text"]
    jsonschema.validate(json.loads(message["content"][0]["text"]), SCHEMA)


def test_streamed_responses_events_rebuild_the_same_items(server):
    whole = post(server, "/v1/responses", RESPONSES).json()["output"]
    response = post(server, "/v1/responses", {**RESPONSES, "stream": True})
    events = [
        json.loads(line[len("data: ") :])
        for line in response.text.split("\n")
        if line.startswith("data: ")
    ]
    kinds = [e["type"] for e in events]
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")
    thought = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert thought == whole[0]["content"][0]["text"]
    assert text == whole[1]["content"][0]["text"]
    assert events[-1]["response"]["output"][0]["type"] == "reasoning"


def test_a_plan_starts_where_the_engine_does(thinker):
    tokenizer = thinker.tokenizer
    opened = tokenizer.encode("<|im_start|>assistant\n<think>\n")
    closed = tokenizer.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert reasoning_plan(thinker.reasoning, opened).phase is Phase.REASONING
    assert reasoning_plan(thinker.reasoning, closed).phase is Phase.ANSWER
    assert reasoning_plan(thinker.reasoning, opened, separate=False) is None
    assert reasoning_plan(None, opened) is None


@pytest.mark.parametrize(
    ("fields", "reasoning", "text"),
    [
        ({}, "a", "b"),  # the server's parser: qwen3, the model may open the section
        ({"reasoning_parser": "deepseek_r1"}, "x <think>a", "b"),  # opened by the template
    ],
)
def test_separate_reasoning_endpoint_splits_as_sglangs(server, fields, reasoning, text):
    body = {"text": "x <think>a</think> b", **fields} if fields else {"text": "<think>a</think>b"}
    answer = post(server, "/separate_reasoning", body).json()
    assert answer == {"text": text, "reasoning_text": reasoning}


def test_an_unknown_parser_name_is_a_400_naming_the_known_ones(server, engine):
    response = post(server, "/separate_reasoning", {"text": "x", "reasoning_parser": "nope"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "reasoning_parser" and "qwen3" in error["message"]
    with running_server(engine) as plain:  # the default model: no reasoning parser
        response = post(plain, "/separate_reasoning", {"text": "<think>a</think>b"})
        assert response.status_code == 400 and "no reasoning parser" in response.text
        response = post(plain, "/v1/chat/completions", CHAT)
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "max_reasoning_tokens"
