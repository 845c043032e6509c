"""The Responses API (``/v1/responses``) over real HTTP with the official client, on
the default model. Greedy answers must equal the chat route's for the same
conversation: the route is the chat conversion behind another shape."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tests.runtime.entrypoints.http.conftest import wait_idle, wait_released

QUESTION = "What is the capital of France?"  # greedy: "The capital of France is Paris." (8)
WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": WEATHER_PARAMS,
        "strict": True,
    }
]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": WEATHER_PARAMS,
            "strict": True,
        },
    }
]
ASK_WEATHER = "What is the weather in Paris? Use the tool."


class Verdict(BaseModel):
    name: str
    ok: bool


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=120)


def chat(client, messages, max_tokens, **fields):
    return client.chat.completions.create(
        model="default", messages=messages, max_tokens=max_tokens, temperature=0, **fields
    )


def create(client, max_output_tokens=16, **fields):
    return client.responses.create(
        model="default", max_output_tokens=max_output_tokens, temperature=0, **fields
    )


def test_create_equals_the_chat_routes_greedy_answer(client):
    response = create(client, input=QUESTION, instructions="Answer in one sentence.")
    expected = chat(
        client,
        [
            {"role": "system", "content": "Answer in one sentence."},
            {"role": "user", "content": QUESTION},
        ],
        16,
    )
    assert response.output_text == expected.choices[0].message.content
    assert response.output_text == "The capital of France is Paris."
    assert response.status == "completed" and response.incomplete_details is None
    assert response.id.startswith("resp_") and response.object == "response"
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.status == "completed"
    assert [part.type for part in message.content] == ["output_text"]
    usage = response.usage
    assert usage.input_tokens == expected.usage.prompt_tokens
    assert usage.output_tokens == expected.usage.completion_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert response.instructions == "Answer in one sentence."
    assert (response.temperature, response.max_output_tokens, response.store) == (0, 16, True)


def test_max_output_tokens_makes_it_incomplete(client):
    response = create(client, max_output_tokens=3, input=QUESTION)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "The capital of"
    assert response.output[0].status == "incomplete" and response.usage.output_tokens == 3


def test_a_list_of_message_items_equals_the_same_chat(client):
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
    ]
    response = create(client, max_output_tokens=8, input=items)
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
    ]
    expected = chat(client, messages, 8)
    assert response.output_text == expected.choices[0].message.content
    assert response.usage.input_tokens == expected.usage.prompt_tokens


def test_parse_with_a_pydantic_model(client):
    prompt = "Describe Paris as JSON."
    response = client.responses.parse(
        model="default", input=prompt, text_format=Verdict, max_output_tokens=40, temperature=0
    )
    assert response.status == "completed"
    assert isinstance(response.output_parsed, Verdict)
    assert response.output_parsed == Verdict.model_validate_json(response.output_text)
    assert response.text.format.type == "json_schema" and response.text.format.name == "Verdict"
    expected = client.chat.completions.parse(
        model="default",
        messages=[{"role": "user", "content": prompt}],
        response_format=Verdict,
        max_tokens=40,
        temperature=0,
    )
    assert response.output_text == expected.choices[0].message.content


class City(BaseModel):
    name: str
    population: int
    area_km2: float


def test_int_and_float_fields_parse_through_both_apis(client):
    """Once greedy decoding wrote ``"population": 1111...`` until the token limit and
    every client's ``parse`` failed; numbers are bounded now (json_bounded_numbers)."""
    prompt = "Describe Paris as JSON with its name, population and area."
    chat = client.chat.completions.parse(
        model="default",
        messages=[{"role": "user", "content": prompt}],
        response_format=City,
        max_tokens=96,
        temperature=0,
    )
    assert chat.choices[0].finish_reason == "stop"
    assert isinstance(chat.choices[0].message.parsed, City)
    response = client.responses.parse(
        model="default", input=prompt, text_format=City, max_output_tokens=96, temperature=0
    )
    assert response.status == "completed" and isinstance(response.output_parsed, City)
    assert response.output_text == chat.choices[0].message.content


def test_json_object_format_gives_an_object(client):
    response = create(
        client,
        max_output_tokens=40,
        input="Describe Paris as JSON.",
        text={"format": {"type": "json_object"}},
    )
    if response.status == "completed":
        assert isinstance(json.loads(response.output_text), dict)
    else:  # cut off: still the start of an object
        assert response.output_text.startswith("{")


def test_stream_sends_the_typed_events_in_order(client, server, http_engine):
    whole = create(client, input=QUESTION)
    with client.responses.stream(
        model="default", input=QUESTION, max_output_tokens=16, temperature=0
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    num_deltas = types.count("response.output_text.delta")
    assert num_deltas >= 1
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * num_deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == final.output_text
    assert events[-4].text == deltas  # output_text.done
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    item_id = events[2].item.id
    assert all(e.item_id == item_id for e in events[3:-2])
    assert final.id == events[0].response.id and final.status == "completed"
    assert final.usage.output_tokens == whole.usage.output_tokens
    wait_released(server.state)
    wait_idle(http_engine)


def test_raw_stream_frames_name_their_events_and_send_no_done(server):
    body = {"model": "default", "input": QUESTION, "max_output_tokens": 2, "stream": True}
    response = httpx.post(server.base_url + "/v1/responses", json=body, timeout=60)
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = response.text[:-2].split("\n\n")
    for frame in frames:
        name, data = frame.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[len("data: ") :])["type"] == name[len("event: ") :]
    assert frames[-1].startswith("event: response.incomplete\n")
    assert "[DONE]" not in response.text


def test_disconnect_mid_stream_aborts_frees_and_stores_nothing(server, client, http_engine):
    body = {
        "model": "default",
        "input": "Write a very long story about a dragon, at least 2000 words.",  # greedy: > 600
        "max_output_tokens": 2000,
        "temperature": 0,
        "stream": True,
    }
    before = http_engine.get_stats().num_generated_tokens
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        with http.stream("POST", "/v1/responses", json=body) as response:
            data = (line for line in response.iter_lines() if line.startswith("data: "))
            created = json.loads(next(data)[len("data: ") :])
            for _ in range(5):
                next(data)
    # the client is gone: its request must stop long before 2000 tokens
    wait_idle(http_engine, timeout_s=10)
    assert http_engine.get_stats().num_generated_tokens - before < 500
    wait_released(server.state)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created["response"]["id"])


def test_tool_round_trip(client, http_engine):
    """required -> a function_call item; its output sent back (by previous_response_id,
    or statelessly with the items resent) -> a text answer equal to the chat route's."""
    first = create(
        client,
        max_output_tokens=40,
        input=ASK_WEATHER,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
    )
    assert first.status == "completed"
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMS)
    expected_call = (
        chat(
            client,
            [{"role": "user", "content": ASK_WEATHER}],
            40,
            tools=CHAT_TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
        )
        .choices[0]
        .message.tool_calls[0]
    )
    assert (call.name, call.arguments) == (
        expected_call.function.name,
        expected_call.function.arguments,
    )

    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}
    follow = dict(max_output_tokens=12, tools=TOOLS, tool_choice="none")
    second = create(client, previous_response_id=first.id, input=[result], **follow)
    [message] = second.output
    assert message.type == "message" and second.output_text
    sent_back = [{"role": "user", "content": ASK_WEATHER}, *first.output, result]
    stateless = create(client, input=sent_back, **follow)
    messages = [
        {"role": "user", "content": ASK_WEATHER},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21 C"},
    ]
    expected = chat(client, messages, 12, tools=CHAT_TOOLS, tool_choice="none")
    assert second.output_text == stateless.output_text == expected.choices[0].message.content
    assert second.usage.input_tokens == stateless.usage.input_tokens
    assert second.usage.input_tokens == expected.usage.prompt_tokens
    wait_idle(http_engine)


def test_streamed_call_arguments_concatenate_to_the_unstreamed_ones(client):
    fields = dict(
        model="default",
        input=ASK_WEATHER,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=40,
        temperature=0,
    )
    whole = client.responses.create(**fields)
    with client.responses.stream(**fields) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    num_deltas = types.count("response.function_call_arguments.delta")
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * num_deltas,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    arguments = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    assert arguments == events[-3].arguments == whole.output[0].arguments
    assert final.output[0].arguments == arguments and final.output[0].name == "get_weather"
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_second_turn_continues_from_the_cached_prefix(client):
    first = create(client, input=QUESTION)
    second = create(
        client, max_output_tokens=8, previous_response_id=first.id, input="And of Italy?"
    )
    assert second.previous_response_id == first.id
    cached = second.usage.input_tokens_details.cached_tokens
    # the whole first prompt (and most of its answer) is found in the radix cache
    assert first.usage.input_tokens <= cached < second.usage.input_tokens
    messages = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And of Italy?"},
    ]
    expected = chat(client, messages, 8)
    assert second.output_text == expected.choices[0].message.content
    assert second.usage.input_tokens == expected.usage.prompt_tokens
    # instructions do not carry over; the third turn sees both earlier turns
    third = create(client, max_output_tokens=4, previous_response_id=second.id, input="Thanks.")
    assert (
        third.usage.input_tokens
        == chat(
            client,
            [
                *messages,
                {"role": "assistant", "content": second.output_text},
                {"role": "user", "content": "Thanks."},
            ],
            4,
        ).usage.prompt_tokens
    )


def test_get_and_delete_by_id(client, server):
    response = create(client, max_output_tokens=2, input=QUESTION, metadata={"k": "v"}, user="u1")
    fetched = client.responses.retrieve(response.id)
    assert fetched.model_dump() == response.model_dump()
    assert fetched.metadata == {"k": "v"} and fetched.user == "u1"
    deleted = httpx.delete(f"{server.base_url}/v1/responses/{response.id}", timeout=10)
    assert deleted.json() == {"id": response.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    unstored = create(client, max_output_tokens=2, input=QUESTION, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


@pytest.mark.parametrize(
    ("path", "method"),
    [("/v1/responses/resp_unknown", "GET"), ("/v1/responses/resp_unknown", "DELETE")],
)
def test_unknown_ids_are_404(server, path, method):
    response = httpx.request(method, server.base_url + path, timeout=10)
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("response_id", "response_not_found")


Q = {"model": "default", "input": QUESTION, "max_output_tokens": 2}


@pytest.mark.parametrize(
    ("fields", "status", "param", "code"),
    [
        ({"previous_response_id": "resp_nope"}, 404, "previous_response_id", "response_not_found"),
        ({"model": "gpt-9"}, 404, "model", "model_not_found"),
        ({"reasoning": {"effort": "extreme"}}, 400, "reasoning.effort", None),
        ({"reasoning": {"effort": "low", "x": 1}}, 400, "reasoning.x", "unsupported_parameter"),
        ({"include": ["message.output_text.logprobs"]}, 400, "include", "unsupported_parameter"),
        ({"background": True}, 400, "background", "unsupported_parameter"),
        ({"truncation": "auto"}, 400, "truncation", "unsupported_parameter"),
        ({"text": {"verbosity": "low"}}, 400, "text.verbosity", "unsupported_parameter"),
        ({"frobnicate": 1}, 400, "frobnicate", None),
        ({"temperature": 101}, 400, "temperature", None),
        ({"max_output_tokens": "5"}, 400, "max_output_tokens", None),
        ({"max_output_tokens": 9000}, 400, "max_output_tokens", "context_length_exceeded"),
        ({"input": []}, 400, "input", None),
        ({"input": [{"type": "reasoning", "summary": []}]}, 400, "input.0", None),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            400,
            "input.0.content.0",
            None,
        ),
        ({"input": [{"type": "function_call", "name": "f"}]}, 400, "input.0.call_id", None),
        ({"tools": [{"type": "function", "name": "bad name"}]}, 400, "tools.0.name", None),
        ({"tools": [{"type": "web_search"}]}, 400, "tools.0.type", None),
        ({"tool_choice": "required"}, 400, "tool_choice", None),
        (
            {"tools": TOOLS, "text": {"format": {"type": "json_object"}}},
            400,
            "text.format",
            None,
        ),
        (
            {"text": {"format": {"type": "json_schema", "name": "x"}}},
            400,
            "text.format.schema",
            None,
        ),
        (
            {
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "x",
                        "schema": {"type": "integer", "minimum": 5, "maximum": 1},
                    }
                }
            },
            400,
            "text.format",
            "invalid_grammar",
        ),
        ({"stream_options": {"include_obfuscation": False}}, 400, "stream_options", None),
    ],
)
def test_bad_requests_get_openai_errors(server, http_engine, fields, status, param, code):
    response = httpx.post(server.base_url + "/v1/responses", json={**Q, **fields}, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code)
    wait_idle(http_engine)


def test_streamed_bad_request_is_a_4xx_before_streaming(server):
    schema = {"type": "integer", "minimum": 5, "maximum": 1}
    body = {
        **Q,
        "stream": True,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}},
    }
    response = httpx.post(server.base_url + "/v1/responses", json=body, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "text.format"


def test_harmless_fields_are_accepted_and_echoed(client):
    response = create(
        client,
        max_output_tokens=2,
        input=QUESTION,
        metadata={"team": "a"},
        user="u",
        service_tier="auto",
        truncation="disabled",
        safety_identifier="s",
        prompt_cache_key="k",
        store=True,
        reasoning=None,
    )
    assert response.metadata == {"team": "a"} and response.user == "u"
    assert response.truncation == "disabled" and response.service_tier == "default"
