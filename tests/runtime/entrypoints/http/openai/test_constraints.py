"""vLLM's structured-output fields (``structured_outputs``, ``guided_*``) as radixlm's
constraints: the mapping with a fake tokenizer (no model), then through the official
``openai`` client's ``extra_body`` on a real loopback server."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from radixlm.runtime.entrypoints.http.openai.constraints import (
    grammar_field,
    one_constraint,
    requested_constraints,
)
from radixlm.runtime.entrypoints.http.openai.convert import chat_call, completion_call
from radixlm.runtime.entrypoints.http.openai.prompts import PromptBuilder
from radixlm.runtime.entrypoints.http.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
)
from radixlm.runtime.entrypoints.http.server.errors import APIError
from radixlm.runtime.io.context_room import ContextRoom
from tests.runtime.entrypoints.http.conftest import wait_idle
from tests.runtime.entrypoints.http.openai.test_openai_convert import CharTokenizer

PROMPTS = PromptBuilder(CharTokenizer(), ContextRoom(64))
SCHEMA = {
    "type": "object",
    "properties": {"colour": {"type": "string", "maxLength": 8}},
    "required": ["colour"],
    "additionalProperties": False,
}
EBNF = 'root ::= "yes" | "no"'
LARK = 'start: "yes" | "no"'
TAG = {"type": "structural_tag", "format": {"type": "const_string", "value": "Hi"}}


def chat(**fields):
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate(body)


def completion(**fields):
    return CompletionRequest.model_validate({"model": "default", "prompt": "hi", **fields})


def params_of(call):
    return call.requests[0].sampling_params


@pytest.mark.parametrize(
    ("fields", "engine_field", "expected"),
    [
        ({"guided_regex": "[0-9]+"}, "regex", "[0-9]+"),
        ({"structured_outputs": {"regex": "[0-9]+"}}, "regex", "[0-9]+"),
        ({"guided_choice": ["a", "b"]}, "choices", ("a", "b")),
        ({"structured_outputs": {"choice": ["a", "b"]}}, "choices", ("a", "b")),
        ({"guided_json": SCHEMA}, "json_schema", json.dumps(SCHEMA, separators=(",", ":"))),
        ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, "json_schema", None),
        ({"structured_outputs": {"json_object": True}}, "json_schema", '{"type":"object"}'),
        ({"guided_grammar": EBNF}, "ebnf", EBNF),
        ({"structured_outputs": {"grammar": EBNF}}, "ebnf", EBNF),
        ({"guided_grammar": LARK}, "lark", LARK),
        ({"structured_outputs": {"grammar": LARK}}, "lark", LARK),
        ({"structured_outputs": {"structural_tag": TAG}}, "structural_tag", None),
        ({"structural_tag": json.dumps(TAG)}, "structural_tag", None),
    ],
)
def test_vllm_forms_map_to_one_engine_constraint(fields, engine_field, expected):
    params = params_of(chat_call(chat(**fields), PROMPTS))
    assert getattr(params, engine_field) is not None
    if expected is not None:
        assert getattr(params, engine_field) == expected
    others = {"regex", "json_schema", "ebnf", "lark", "choices", "structural_tag"} - {engine_field}
    assert all(getattr(params, name) is None for name in others)


def test_json_schema_text_and_object_give_the_same_constraint():
    as_text = params_of(chat_call(chat(structured_outputs={"json": json.dumps(SCHEMA)}), PROMPTS))
    as_object = params_of(chat_call(chat(guided_json=SCHEMA), PROMPTS))
    assert as_text.json_schema == as_object.json_schema
    assert json.loads(as_text.json_schema) == SCHEMA


def test_completions_take_the_same_forms_and_sglangs_json_schema():
    assert params_of(completion_call(completion(guided_regex="a+"), PROMPTS)).regex == "a+"
    assert params_of(completion_call(completion(json_schema=SCHEMA), PROMPTS)).json_schema
    fmt = {"type": "json_object"}
    params = params_of(completion_call(completion(response_format=fmt), PROMPTS))
    assert params.json_schema == '{"type":"object"}'


def test_grammar_kind_is_read_off_the_rules():
    assert grammar_field('root ::= "a"') == "ebnf"
    assert grammar_field('root::="a"\nx ::= "b"') == "ebnf"
    assert grammar_field('start: "a" | "b"') == "lark"


def test_options_alone_ask_for_no_constraint():
    options = {"disable_any_whitespace": True, "whitespace_pattern": " ", "disable_fallback": True}
    assert requested_constraints(chat(structured_outputs=options)) == []
    assert requested_constraints(chat(structured_outputs={"json_object": False})) == []
    params = params_of(chat_call(chat(structured_outputs=options), PROMPTS))
    assert params.grammar is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"regex": "a", "choices": ["x"]}, "choices"),  # radixlm's own conflict, unchanged
        ({"regex": "a", "guided_choice": ["x"]}, "guided_choice"),
        ({"guided_regex": "a", "guided_json": SCHEMA}, "guided_regex"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
        ({"structured_outputs": {"regex": "a", "choice": ["x"]}}, "structured_outputs.choice"),
        (
            {"guided_grammar": EBNF, "structured_outputs": {"json": SCHEMA}},
            "structured_outputs.json",
        ),
        (
            {"structured_outputs": {"json_object": True, "structural_tag": TAG}},
            "structured_outputs.structural_tag",
        ),
    ],
)
def test_two_constraints_are_a_400_naming_the_second(fields, param):
    with pytest.raises(APIError) as info:
        chat_call(chat(**fields), PROMPTS)
    assert (info.value.status, info.value.param) == (400, param)
    assert info.value.message.startswith(f"{param} cannot be combined with ")
    assert info.value.message.endswith(": a request takes one output constraint")


def test_two_constraints_say_both_names_as_sent():
    with pytest.raises(APIError) as info:
        chat_call(chat(response_format={"type": "json_object"}, guided_regex="a"), PROMPTS)
    assert info.value.body()["error"] == {
        "message": "guided_regex cannot be combined with response_format: "
        "a request takes one output constraint",
        "type": "invalid_request_error",
        "param": "guided_regex",
        "code": None,
    }


def test_one_constraint_of_none_is_none():
    assert one_constraint([]) is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"guided_regex": ""}, "guided_regex"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"guided_json": "{not json"}, "guided_json"),
    ],
)
def test_a_bad_value_is_a_400_naming_the_field_the_client_sent(fields, param):
    with pytest.raises(APIError) as info:
        chat_call(chat(**fields), PROMPTS)
    assert (info.value.status, info.value.param) == (400, param)


def test_the_call_names_the_field_for_the_engines_later_errors():
    call = chat_call(chat(guided_json=SCHEMA), PROMPTS)
    assert call.param_names["json_schema"] == "guided_json"
    assert chat_call(chat(), PROMPTS).param_names["json_schema"] == "response_format"


def test_tools_exclude_the_vllm_forms_too():
    weather = {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}
    with pytest.raises(APIError) as info:
        chat_call(chat(tools=[weather], tool_choice="required", guided_regex="a"), PROMPTS)
    assert info.value.param == "guided_regex"
    assert info.value.message == (
        "guided_regex cannot be combined with tools under tool_choice 'required': "
        "a request takes one output constraint"
    )


def test_structured_outputs_is_closed():
    with pytest.raises(Exception) as info:
        chat(structured_outputs={"regexp": "a"})
    assert info.value.errors()[0]["loc"] == ("structured_outputs", "regexp")


# --- through the openai client on a real server --------------------------------------------

MESSAGES = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=60)


def ask_chat(client, extra, max_tokens):
    reply = client.chat.completions.create(
        model="default", messages=MESSAGES, max_tokens=max_tokens, temperature=0, extra_body=extra
    )
    return reply.choices[0]


@pytest.mark.parametrize(
    "extra", [{"guided_regex": "[0-9]{3}"}, {"structured_outputs": {"regex": "[0-9]{3}"}}]
)
def test_regex_forms_over_http(client, extra):
    text = ask_chat(client, extra, 8).message.content
    assert re.fullmatch("[0-9]{3}", text), text


@pytest.mark.parametrize(
    "extra",
    [{"guided_choice": ["red", "blue"]}, {"structured_outputs": {"choice": ["red", "blue"]}}],
)
def test_choice_forms_over_http(client, extra):
    assert ask_chat(client, extra, 8).message.content in ("red", "blue")


@pytest.mark.parametrize(
    "extra",
    [
        {"guided_json": SCHEMA},
        {"structured_outputs": {"json": SCHEMA}},
        {"structured_outputs": {"json": json.dumps(SCHEMA), "disable_any_whitespace": True}},
    ],
)
def test_json_forms_over_http(client, extra):
    choice = ask_chat(client, extra, 40)
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_json_object_over_http(client):
    choice = ask_chat(client, {"structured_outputs": {"json_object": True}}, 40)
    assert isinstance(json.loads(choice.message.content), dict)


@pytest.mark.parametrize(
    "extra",
    [
        {"guided_grammar": EBNF},
        {"structured_outputs": {"grammar": EBNF}},
        {"guided_grammar": LARK},
        {"structured_outputs": {"grammar": LARK}},
    ],
)
def test_grammar_forms_over_http(client, extra):
    assert ask_chat(client, extra, 4).message.content in ("yes", "no")


def test_completions_over_http(client):
    def complete(extra, max_tokens=8):
        reply = client.completions.create(
            model="default",
            prompt="The best colour is",
            max_tokens=max_tokens,
            temperature=0,
            extra_body=extra,
        )
        return reply.choices[0].text

    assert re.fullmatch("[0-9]{3}", complete({"guided_regex": "[0-9]{3}"}))
    assert complete({"structured_outputs": {"choice": ["red", "blue"]}}) in ("red", "blue")
    jsonschema.validate(json.loads(complete({"guided_json": SCHEMA}, 40)), SCHEMA)
    assert complete({"guided_grammar": EBNF}, 4) in ("yes", "no")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"guided_regex": "a", "guided_choice": ["x"]}, "guided_choice"),
        ({"structured_outputs": {"regex": "a", "choice": ["x"]}}, "structured_outputs.choice"),
        ({"choices": ["x"], "structured_outputs": {"json": SCHEMA}}, "structured_outputs.json"),
        ({"guided_regex": "("}, "guided_regex"),  # the engine's error, named as sent
        ({"structured_outputs": {"grammar": "root ::= "}}, "structured_outputs.grammar"),
    ],
)
def test_errors_over_http_name_the_field(client, server, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        ask_chat(client, extra, 4)
    assert info.value.status_code == 400
    assert info.value.body["param"] == param, info.value.body
    wait_idle(server.state.engine)


@pytest.mark.parametrize("build", [chat_call, completion_call])
def test_json_max_string_length_reaches_the_schemas_spec(build):
    body = (chat if build is chat_call else completion)(
        guided_json=SCHEMA, json_max_string_length=12
    )
    assert params_of(build(body, PROMPTS)).grammar.max_string_length == 12


@pytest.mark.parametrize("value", [-1, 16_385, 2.5])
def test_a_json_max_string_length_out_of_bounds_is_refused_by_the_body(value):
    with pytest.raises(ValueError, match="json_max_string_length"):
        chat(json_max_string_length=value)
