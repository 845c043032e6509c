"""Tool calls over real HTTP with the official client, on the default model (SmolLM2,
whose template has no tools: the fallback prompt). Its own tool choices are poor;
the grammar is what makes every call parse and validate."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.runtime.entrypoints.http.conftest import wait_idle

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 12}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": WEATHER_PARAMS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The current time in a timezone.",
            "parameters": TIME_PARAMS,
        },
    },
]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
CHAT = [{"role": "user", "content": "Say hello."}]
OSLO = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'},
}
# One example call in the history: the tiny model then calls by itself under "auto".
ONE_SHOT = [
    {"role": "user", "content": "What is the weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [OSLO]},
    {"role": "user", "content": "What is the weather in Paris?"},
]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=120)


def create(client, messages, **fields):
    fields.setdefault("max_tokens", 48)
    fields.setdefault("temperature", 0)
    return client.chat.completions.create(model="default", messages=messages, tools=TOOLS, **fields)


def assert_valid_calls(message, names=SCHEMAS):
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_gives_calls_that_validate(client, http_engine):
    reply = create(client, ASK_WEATHER, tool_choice="required", parallel_tool_calls=False)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert_valid_calls(choice.message)
    assert len(choice.message.tool_calls) == 1
    wait_idle(http_engine)


def finished_calls(choice) -> list:
    """The calls that were written to the end: all of them unless max_tokens cut the last."""
    calls = choice.message.tool_calls or []
    return calls if choice.finish_reason == "tool_calls" else calls[:-1]


def test_required_with_parallel_calls_and_samples(client):
    reply = create(client, ASK_WEATHER, tool_choice="required", n=2, temperature=1.0, seed=3)
    num_finished = 0
    for choice in reply.choices:
        assert choice.finish_reason in ("tool_calls", "length")
        assert choice.message.tool_calls  # a call starts at the first token
        for call in finished_calls(choice):
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
            num_finished += 1
    assert num_finished >= 1


def test_named_choice_calls_that_function(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    reply = create(client, ASK_WEATHER, tool_choice=named)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [c.function.name for c in choice.message.tool_calls] == ["get_time"]
    assert_valid_calls(choice.message, names={"get_time"})


def test_auto_gives_text_or_valid_calls(client):
    """Both shapes occur: a greeting is answered in text; after one example of a call in
    the history, a like question is answered with a call, and it validates."""
    text = create(client, CHAT, tool_choice="auto", max_tokens=16).choices[0]
    assert text.message.tool_calls is None and text.message.content
    assert text.finish_reason in ("stop", "length")
    called = create(client, ONE_SHOT, tool_choice="auto").choices[0]
    assert called.finish_reason == "tool_calls"
    assert [c.function.name for c in called.message.tool_calls] == ["get_weather"]
    assert_valid_calls(called.message)


def test_auto_calls_validate_under_sampling(client):
    """Sampled at temperature 1 (seeded), every call that appears validates."""
    reply = create(client, ONE_SHOT, tool_choice="auto", n=4, temperature=1.0, seed=11)
    num_finished = 0
    for choice in reply.choices:
        for call in finished_calls(choice):
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
            num_finished += 1
    assert num_finished >= 1


@pytest.mark.parametrize(
    ("messages", "fields"),
    [
        (ASK_WEATHER, {"tool_choice": "required", "parallel_tool_calls": False}),
        (ONE_SHOT, {"tool_choice": "auto"}),
        (CHAT, {"tool_choice": "auto", "max_tokens": 16}),
    ],
    ids=["required", "auto-call", "auto-text"],
)
def test_streamed_answers_concatenate_to_the_unstreamed_ones(client, messages, fields):
    whole = create(client, messages, **fields).choices[0]
    chunks = list(create(client, messages, stream=True, **fields))
    calls: dict[int, dict] = {}
    content = ""
    for chunk in chunks:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for entry in delta.tool_calls or []:
            if entry.id is not None:
                assert entry.index not in calls
                assert entry.type == "function" and entry.function.name
                assert entry.id.startswith("call_")
                calls[entry.index] = {"name": entry.function.name, "arguments": ""}
            calls[entry.index]["arguments"] += entry.function.arguments or ""
    assert content == (whole.message.content or "")
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls or []
    ]
    assert bool(calls) == (whole.finish_reason == "tool_calls")


def test_none_never_calls(client):
    """The history shows a call, so the model writes one greedily (as under "auto");
    under "none" it is neither constrained nor parsed: it stays text."""
    reply = create(client, ONE_SHOT, tool_choice="none").choices[0]
    assert reply.message.tool_calls is None
    assert reply.finish_reason in ("stop", "length")
    assert "<tool_call>" in reply.message.content


def test_a_conversation_with_calls_and_results_renders(client):
    call = {
        "id": "call_abc",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
    }
    messages = [
        *ASK_WEATHER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_abc", "content": '{"temperature": 21}'},
    ]
    reply = create(client, messages, tool_choice="none", max_tokens=8).choices[0]
    assert reply.message.tool_calls is None and reply.message.content is not None


CONTAINS = {"type": "object", "properties": {"a": {"type": "array", "contains": {}}}}
NAMED_NOPE = {"type": "function", "function": {"name": "nope"}}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": TOOLS, "tool_choice": NAMED_NOPE}, "tool_choice"),
        ({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "tools.0.type"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
            "tools.0.function.parameters",
        ),
        (
            # valid JSON Schema, but a keyword the grammar cannot enforce: the engine's 400
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": CONTAINS}}]},
            "tools",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ],
)
def test_bad_tool_requests_are_400s_naming_the_field(server, http_engine, fields, param):
    body = {"model": "default", "messages": CHAT, "max_tokens": 4, **fields}
    response = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    wait_idle(http_engine)
