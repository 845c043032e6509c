"""Responses input -> chat messages, refused fields, and chat errors renamed: no model."""

import pytest

from radixlm.runtime.config import LimitsConfig
from radixlm.runtime.entrypoints.http.responses.convert import (
    check_supported,
    input_messages,
    renamed,
)
from radixlm.runtime.entrypoints.http.responses.protocol import ResponsesRequest
from radixlm.runtime.entrypoints.http.server.errors import INVALID, APIError
from radixlm.runtime.errors import RequestLimitError

LIMITS = LimitsConfig()


def request(**fields) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "default", **fields})


def test_a_string_is_one_user_message():
    assert input_messages(request(input="Hi"), LIMITS) == [{"role": "user", "content": "Hi"}]
    assert input_messages(request(), LIMITS) == []


def test_calls_join_the_assistant_turn_before_them_and_outputs_are_tool_messages():
    items = [
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Let me see."}],
        },
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": '{"x": 1}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "one"},
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [{"type": "input_text", "text": "two"}],
        },
        {"type": "function_call", "call_id": "call_3", "name": "f", "arguments": "{}"},
    ]
    call = lambda i, name, args: {  # noqa: E731
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }
    assert input_messages(request(input=items), LIMITS) == [
        {"role": "user", "content": "ab"},
        {
            "role": "assistant",
            "content": "Let me see.",
            "tool_calls": [call(1, "f", "{}"), call(2, "g", '{"x": 1}')],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "one"},
        {"role": "tool", "tool_call_id": "call_2", "content": "two"},
        {"role": "assistant", "content": None, "tool_calls": [call(3, "f", "{}")]},
    ]


def test_deep_call_arguments_are_refused_naming_the_item():
    deep = "[" * 200 + "]" * 200
    body = request(
        input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": deep}]
    )
    with pytest.raises(RequestLimitError) as info:
        input_messages(body, LIMITS)
    assert info.value.field == "input.0.arguments"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"reasoning": {"effort": "high", "context": "all"}}, "reasoning.context"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"truncation": "auto"}, "truncation"),
        ({"text": {"verbosity": "high"}}, "text.verbosity"),
    ],
)
def test_fields_that_would_change_the_answer_are_refused(fields, param):
    with pytest.raises(APIError) as info:
        check_supported(request(**fields))
    assert (info.value.param, info.value.code) == (param, "unsupported_parameter")


@pytest.mark.parametrize(
    ("reasoning", "param"),
    [
        ({"effort": "extreme"}, "reasoning.effort"),
        ({"summary": "long"}, "reasoning.summary"),
        ("high", "reasoning"),
    ],
)
def test_a_bad_reasoning_option_is_a_400_naming_it(reasoning, param):
    with pytest.raises(APIError) as info:
        check_supported(request(reasoning=reasoning))
    assert info.value.param == param and info.value.code is None


def test_harmless_values_pass():
    check_supported(
        request(
            reasoning={"effort": "low", "summary": "auto"},
            include=[],
            background=False,
            top_logprobs=0,
            truncation="disabled",
            text={"verbosity": "medium"},
            metadata={"a": "b"},
            user="u",
            service_tier="flex",
            store=False,
        )
    )


@pytest.mark.parametrize(
    ("param", "message", "new_param", "new_message"),
    [
        (
            "tools.3.function.name",
            "tools.3.function.name is bad",
            "tools.3.name",
            "tools.3.name is bad",
        ),
        (
            "response_format",
            "response_format cannot be combined",
            "text.format",
            "text.format cannot be combined",
        ),
        (
            "max_completion_tokens",
            "8 tokens (max_completion_tokens)",
            "max_output_tokens",
            "8 tokens (max_output_tokens)",
        ),
        (
            "messages",
            "the template refused the messages",
            "input",
            "the template refused the messages",
        ),
        (None, "overloaded", None, "overloaded"),
    ],
)
def test_chat_errors_get_the_responses_names(param, message, new_param, new_message):
    error = renamed(APIError(INVALID, message, param, code="c", headers={"h": "1"}))
    assert (error.param, error.message, error.code, error.headers) == (
        new_param,
        new_message,
        "c",
        {"h": "1"},
    )
