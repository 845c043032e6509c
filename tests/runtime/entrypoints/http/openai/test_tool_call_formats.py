"""Tool calls over real HTTP in other formats and on llguidance, on the default model
(SmolLM2: its template has no tools, so the fallback prompt shows the server's format).
The model has never seen these formats; the grammar is what makes every call parse and
validate."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.runtime.entrypoints.http.conftest import running_server, wait_idle
from tests.runtime.entrypoints.http.openai.test_tool_calls import (
    ASK_WEATHER,
    ONE_SHOT,
    SCHEMAS,
    TOOLS,
    finished_calls,
)


@pytest.fixture(scope="module")
def llguidance_engine(default_model_dir):
    """An engine whose grammars all compile on llguidance (tool calls: Lark grammars)."""
    from radixlm import Engine

    eng = Engine(
        model_path=str(default_model_dir),
        dtype="float32",
        max_total_tokens=4096,
        grammar_backend="llguidance",
    )
    yield eng
    eng.shutdown()


@pytest.fixture(
    scope="module",
    params=[("xgrammar", "mistral"), ("llguidance", "hermes"), ("llguidance", "qwen3_coder")],
    ids=["xgrammar-mistral", "llguidance-hermes", "llguidance-qwen3_coder"],
)
def client(request, http_engine):
    backend, parser = request.param
    engine = http_engine if backend == "xgrammar" else request.getfixturevalue("llguidance_engine")
    with running_server(engine, tool_call_parser=parser) as server:
        yield openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=120)
    wait_idle(engine)


def create(client, messages, **fields):
    fields.setdefault("max_tokens", 64)
    fields.setdefault("temperature", 0)
    return client.chat.completions.create(model="default", messages=messages, tools=TOOLS, **fields)


def test_required_and_named_calls_validate(client):
    reply = create(client, ASK_WEATHER, tool_choice="required", n=2, temperature=1.0, seed=5)
    num_finished = 0
    for choice in reply.choices:
        assert choice.message.tool_calls, choice  # a call starts at the first token
        for call in finished_calls(choice):
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
            num_finished += 1
    assert num_finished >= 1
    named = {"type": "function", "function": {"name": "get_time"}}
    choice = create(client, ASK_WEATHER, tool_choice=named).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_time"])


def test_streamed_calls_concatenate_to_the_unstreamed_ones(client):
    fields = {"tool_choice": "auto"}
    whole = create(client, ONE_SHOT, **fields).choices[0]
    calls: dict[int, dict] = {}
    content = ""
    for chunk in create(client, ONE_SHOT, stream=True, **fields):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for entry in delta.tool_calls or []:
            if entry.id is not None:
                calls[entry.index] = {"name": entry.function.name, "arguments": ""}
            calls[entry.index]["arguments"] += entry.function.arguments or ""
    assert content == (whole.message.content or "")
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls or []
    ]
    for call in finished_calls(whole):
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_server_info_says_which_format_the_model_got(server):
    info = httpx.get(server.base_url + "/server_info", timeout=60).json()
    assert info["tool_call_format"] == "hermes"  # SmolLM2's template has no tools
    assert info["server"]["tool_call_parser"] is None


def test_an_unknown_parser_name_is_a_400(server, http_engine):
    body = {
        "model": "default",
        "messages": ASK_WEATHER,
        "tools": TOOLS,
        "tool_call_parser": "hermes2",
        "max_tokens": 4,
    }
    response = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "tool_call_parser"
    assert "hermes2" in error["message"] and "mistral" in error["message"]
    wait_idle(http_engine)
