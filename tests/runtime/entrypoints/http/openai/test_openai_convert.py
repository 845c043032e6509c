"""OpenAI bodies -> GenerateRequests, and outputs -> OpenAI bodies, with a fake
tokenizer (one token per character): no model."""

import pytest

from radixlm.runtime.entrypoints.http.openai.convert import chat_call, completion_call
from radixlm.runtime.entrypoints.http.openai.format import ResponseFormatter, usage
from radixlm.runtime.entrypoints.http.openai.prompts import PromptBuilder
from radixlm.runtime.entrypoints.http.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
)
from radixlm.runtime.entrypoints.http.server.errors import APIError
from radixlm.runtime.io.context_room import ContextRoom
from radixlm.runtime.io.messages import FinishReason, GenerateOutput, LogprobSpec


class CharTokenizer:
    """Token id = code point; a chat template of ``<role>content\\n`` lines."""

    chat_template = "fake"

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def decode(self, ids):
        return "".join(chr(i) for i in ids)

    def __len__(self):  # the vocabulary: every code point below 0x110000
        return 0x110000


PROMPTS = PromptBuilder(CharTokenizer(), ContextRoom(64))


def chat(**fields):
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate(body)


def test_chat_renders_the_template_and_maps_params():
    call = chat_call(
        chat(max_tokens=5, temperature=0, stop="x", seed=7, n=2, presence_penalty=0.5), PROMPTS
    )
    (request,) = call.requests
    assert CharTokenizer().decode(request.input_ids) == "<user>hi\n<assistant>"
    p = request.sampling_params
    assert (p.max_new_tokens, p.temperature, p.stop, p.seed, p.n, p.presence_penalty) == (
        5,
        0.0,
        ("x",),
        7,
        2,
        0.5,
    )
    assert (call.num_samples, call.stream) == (2, False)


def test_developer_role_is_system_and_parts_join():
    body = chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ]
    )
    (request,) = chat_call(body, PROMPTS).requests
    assert CharTokenizer().decode(request.input_ids) == "<system>be brief\n<user>ab\n<assistant>"


def test_max_completion_tokens_wins_and_omitted_means_the_rest_of_the_context():
    (request,) = chat_call(chat(max_tokens=3, max_completion_tokens=4), PROMPTS).requests
    assert request.sampling_params.max_new_tokens == 4
    (request,) = chat_call(chat(), PROMPTS).requests
    assert request.sampling_params.max_new_tokens == 64 - len("<user>hi\n<assistant>")


def test_context_overflow_is_400_context_length_exceeded():
    with pytest.raises(APIError) as info:
        chat_call(chat(max_tokens=60), PROMPTS)
    assert (info.value.status, info.value.code, info.value.param) == (
        400,
        "context_length_exceeded",
        "max_tokens",
    )


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ({"type": "text"}, None),
        ({"type": "json_object"}, '{"type":"object"}'),
        (
            {
                "type": "json_schema",
                "json_schema": {
                    "name": "p",
                    "strict": True,
                    "schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
                },
            },
            '{"type":"object","properties":{"a":{"type":"integer"}}}',
        ),
    ],
)
def test_response_format_becomes_a_json_schema(fmt, expected):
    (request,) = chat_call(chat(response_format=fmt), PROMPTS).requests
    assert request.sampling_params.json_schema == expected


def test_extras_map_to_constraints_and_two_constraints_are_refused():
    (request,) = chat_call(chat(regex="[ab]+", min_tokens=1, top_k=3), PROMPTS).requests
    p = request.sampling_params
    assert (p.regex, p.min_new_tokens, p.top_k) == ("[ab]+", 1, 3)
    with pytest.raises(APIError) as info:
        chat_call(chat(regex="a", choices=["x", "y"]), PROMPTS)
    assert info.value.status == 400 and info.value.param == "choices"


def test_logprobs_options():
    (request,) = chat_call(chat(logprobs=True, top_logprobs=3), PROMPTS).requests
    assert (request.return_logprob, request.top_logprobs_num) == (True, 3)
    with pytest.raises(APIError, match="top_logprobs needs logprobs"):
        chat_call(chat(top_logprobs=3), PROMPTS)


def test_unsupported_fields_are_refused():
    with pytest.raises(APIError) as info:
        chat_call(chat(logit_bias={"1": 5.0}), PROMPTS)
    assert info.value.param == "logit_bias"
    with pytest.raises(APIError) as info:
        chat_call(chat(stream_options={"include_usage": True}), PROMPTS)
    assert info.value.param == "stream_options"


def test_completions_take_strings_lists_and_token_ids():
    body = CompletionRequest.model_validate(
        {"model": "m", "prompt": ["ab", "c"], "max_tokens": 2, "echo": True, "logprobs": 1}
    )
    call = completion_call(body, PROMPTS)
    assert [r.input_ids for r in call.requests] == [(97, 98), (99,)]
    assert call.prompt_texts == ("ab", "c")
    assert call.requests[0].logprob_start_len == 0  # echo + logprobs: the prompt's too
    ids = CompletionRequest.model_validate({"model": "m", "prompt": [[97], [98, 99]]})
    call = completion_call(ids, PROMPTS)
    assert call.prompt_texts == ("a", "bc") and call.requests[1].input_ids == (98, 99)
    with pytest.raises(APIError):
        completion_call(CompletionRequest.model_validate({"model": "m", "prompt": ""}), PROMPTS)


@pytest.mark.parametrize("prompt", [[97, 0x110000], [[97], [-1]], [10**30]])
def test_completion_token_ids_outside_the_vocabulary_are_a_400(prompt):
    body = CompletionRequest.model_validate({"model": "m", "prompt": prompt})
    with pytest.raises(APIError, match="token ids must be ints in") as info:
        completion_call(body, PROMPTS)
    assert info.value.status == 400 and info.value.param == "prompt"


class FakeTexts:
    def token_bytes(self, token_id):
        return chr(token_id).encode()

    def text(self, token_id):
        return chr(token_id)


def _output(index, text, ids, logprobs=(), prompt=(104, 105)):
    return GenerateOutput(
        rid=f"r{index}",
        index=index,
        text=text,
        output_ids=tuple(ids),
        finish_reason=FinishReason("length", length=len(ids)),
        prompt_tokens=len(prompt),
        cached_tokens=1,
        e2e_latency=0.1,
        ttft=0.01,
        logprob=LogprobSpec(bool(logprobs), 0, 1),
        prompt_ids=tuple(prompt),
        prompt_logprobs=((1, (-0.5, 105, [(-0.5, 105)])),),
        output_logprobs=tuple(logprobs),
    )


def test_chat_choice_logprobs_content_shape():
    fmt = ResponseFormatter("chat", "default", FakeTexts())
    out = _output(0, "ok", [111, 107], [(-0.1, 111, [(-0.1, 111)]), (-0.2, 107, [(-0.2, 107)])])
    choice = fmt.chat_choice(out)
    assert choice["message"] == {"role": "assistant", "content": "ok"}
    assert choice["finish_reason"] == "length"
    first = choice["logprobs"]["content"][0]
    assert first == {
        "token": "o",
        "logprob": -0.1,
        "bytes": [111],
        "top_logprobs": [{"token": "o", "logprob": -0.1, "bytes": [111]}],
    }


def test_completion_echo_logprobs_start_with_the_prompt():
    fmt = ResponseFormatter("completion", "m", FakeTexts())
    out = _output(0, "o", [111], [(-0.1, 111, [(-0.1, 111)])])
    choice = fmt.completion_choice(out, echo_text="hi")
    assert choice["text"] == "hio"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["h", "i", "o"]
    assert lp["token_logprobs"] == [None, -0.5, -0.1]
    assert lp["text_offset"] == [0, 1, 2]
    assert lp["top_logprobs"] == [None, {"i": -0.5}, {"o": -0.1}]


def test_usage_counts_each_prompt_once():
    outs = [_output(0, "a", [1, 2]), _output(1, "b", [3])]
    assert usage(outs, n=2) == {
        "prompt_tokens": 2,
        "completion_tokens": 3,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 1},
    }


def test_top_logprobs_are_capped_by_the_engines_limit_alone():
    """The routes hold no cap of their own: raising ``max_top_logprobs_num`` lifts it on
    every route, and past it each names its own field."""
    from radixlm.runtime.config import LimitsConfig
    from radixlm.runtime.entrypoints.http.server.errors import api_error_from
    from radixlm.runtime.errors import RequestLimitError
    from radixlm.runtime.io.limits import check_request

    wide, default = LimitsConfig(max_top_logprobs_num=30), LimitsConfig()
    chat_body = chat(logprobs=True, top_logprobs=25)
    completion_body = CompletionRequest.model_validate(
        {"model": "default", "prompt": "hi", "max_tokens": 1, "logprobs": 25}
    )
    for call, field in (
        (chat_call(chat_body, PROMPTS), "top_logprobs"),
        (completion_call(completion_body, PROMPTS), "logprobs"),
    ):
        (request,) = call.requests
        assert request.top_logprobs_num == 25
        check_request(request, wide)
        with pytest.raises(RequestLimitError) as refused:
            check_request(request, default)
        assert api_error_from(refused.value, dict(call.param_names)).param == field
