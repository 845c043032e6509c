"""Error mapping and SSE framing: pure logic, no model."""

import json

import pytest

from radixlm.runtime.entrypoints.http.openai.protocol import ChatCompletionRequest
from radixlm.runtime.entrypoints.http.server.errors import (
    INVALID,
    APIError,
    api_error_from,
    validation_error,
)
from radixlm.runtime.entrypoints.http.server.sse import SSE_DONE, sse_event
from radixlm.runtime.errors import (
    EngineStoppedError,
    GrammarError,
    InvalidRequestError,
    InvalidSamplingParamsError,
)


def test_api_error_body_is_openai_shaped():
    err = APIError(INVALID, "n must be >= 1", "n")
    assert err.status == 400
    assert err.body() == {
        "error": {
            "message": "n must be >= 1",
            "type": "invalid_request_error",
            "param": "n",
            "code": None,
        }
    }


@pytest.mark.parametrize(
    ("exc", "status", "param", "code"),
    [
        (GrammarError("regex", "bad"), 400, "regex", "invalid_grammar"),
        (InvalidSamplingParamsError("max_new_tokens", "too long"), 400, "max_tokens", None),
        (InvalidSamplingParamsError("top_p", "bad"), 400, "top_p", None),
        (InvalidRequestError("prompt is empty"), 400, None, None),
        (EngineStoppedError("stopped"), 503, None, "engine_stopped"),
        (RuntimeError("boom"), 500, None, "internal_error"),
    ],
)
def test_engine_errors_map_by_class(exc, status, param, code):
    err = api_error_from(exc, {"max_new_tokens": "max_tokens"})
    assert (err.status, err.param, err.code) == (status, param, code)
    assert err.body()["error"]["message"]


def test_validation_error_names_the_field_path():
    with pytest.raises(Exception) as info:
        ChatCompletionRequest.model_validate_json(
            b'{"model": "m", "messages": [{"role": "user", "content": 3}]}'
        )
    err = validation_error(info.value.errors(include_url=False))
    assert err.status == 400 and err.param.startswith("messages.0.content")


def test_validation_error_for_bad_json_says_so():
    with pytest.raises(Exception) as info:
        ChatCompletionRequest.model_validate_json(b"{not json")
    err = validation_error(info.value.errors(include_url=False))
    assert (err.status, err.code, err.param) == (400, "json_invalid", None)


def test_strict_types_refuse_strings_for_numbers():
    with pytest.raises(Exception) as info:
        ChatCompletionRequest.model_validate_json(
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "5"}'
        )
    assert validation_error(info.value.errors(include_url=False)).param == "max_tokens"


def test_unknown_fields_are_refused_by_name():
    with pytest.raises(Exception) as info:
        ChatCompletionRequest.model_validate_json(
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temprature": 1}'
        )
    assert validation_error(info.value.errors(include_url=False)).param == "temprature"


def test_sse_event_is_one_data_line_even_with_newlines():
    event = sse_event({"text": "a\nb", "x": "é"})
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert event.count(b"\n") == 2
    assert json.loads(event[len(b"data: ") : -2]) == {"text": "a\nb", "x": "é"}
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_union_member_tags_are_left_out_of_param():
    loc = ("body", "tool_choice", "literal['none','auto','required']")
    error = validation_error([{"loc": loc, "msg": "Input should be 'none'", "type": "x"}])
    assert error.param == "tool_choice"
    nested = ("body", "tools", 0, "NamedToolChoice", "function", "name")
    assert validation_error([{"loc": nested, "msg": "x", "type": "missing"}]).param == (
        "tools.0.function.name"
    )
