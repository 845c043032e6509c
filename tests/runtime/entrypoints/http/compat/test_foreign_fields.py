"""The field names vLLM's and SGLang's servers define, on radixlm's routes: the lists'
invariants and the honoured template fields with a fake tokenizer (no model), then
every accepted name posted to a real loopback server."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from radixlm.runtime.entrypoints.http.compat.fields import (
    CHAT,
    COMPLETIONS,
    GENERATE,
    SAMPLING_PARAMS,
    asks_for_nothing,
    screen_sampling_params,
)
from radixlm.runtime.entrypoints.http.native.routes import GenerateBody
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

MODELS = [(ChatCompletionRequest, CHAT), (CompletionRequest, COMPLETIONS), (GenerateBody, GENERATE)]


@pytest.mark.parametrize(("model", "fields"), MODELS)
def test_honoured_names_are_declared_and_the_others_are_not(model, fields):
    declared = set(model.model_fields)
    assert fields.honoured <= declared, fields.honoured - declared
    assert not (fields.ignored | set(fields.unsupported)) & declared


def test_unsupported_values_that_ask_for_nothing():
    for value in (None, False, "", [], {}):
        assert asks_for_nothing("lora_path", value)
    for value in ("adapter", True, ["a"], {"a": 1}, 0.5):
        assert not asks_for_nothing("lora_path", value)
    assert asks_for_nothing("best_of", 1)
    assert not asks_for_nothing("best_of", 2) and not asks_for_nothing("best_of", True)


def chat_body(**fields):
    return {"model": "default", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_ignored_names_validate_whatever_their_value_and_are_logged(caplog):
    with caplog.at_level(logging.DEBUG, logger="radixlm.http"):
        ChatCompletionRequest.model_validate(chat_body(rid=[1, {"x": None}], store=True))
    assert "['rid', 'store']" in caplog.text


def test_an_unsupported_name_that_asks_for_something_is_refused_by_name():
    ChatCompletionRequest.model_validate(chat_body(lora_path=None, use_beam_search=False))
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(chat_body(lora_path="my-adapter"))
    (error,) = info.value.errors()
    assert error["loc"] == ("lora_path",) and "LoRA adapters" in error["msg"]


def test_a_name_no_server_knows_is_still_extra_forbidden():
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(chat_body(rid="a", temprature=1))
    (error,) = info.value.errors()
    assert (error["type"], error["loc"]) == ("extra_forbidden", ("temprature",))


class RecordingTokenizer(CharTokenizer):
    """CharTokenizer that keeps the keyword arguments of its last template render and
    honours continue_final_message (no trailing newline after the last message)."""

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, **kwargs):
        self.kwargs = {"add_generation_prompt": add_generation_prompt, **kwargs}
        text = super().apply_chat_template(messages, tokenize, add_generation_prompt)
        return text[:-1] if kwargs.get("continue_final_message") else text

    def __call__(self, text, add_special_tokens=True):
        ids = super().__call__(text)["input_ids"]
        return {"input_ids": [0x2, *ids] if add_special_tokens else ids}  # 0x2: a "BOS"


def render(**fields):
    tokenizer = RecordingTokenizer()
    body = ChatCompletionRequest.model_validate(chat_body(**fields))
    call = chat_call(body, PromptBuilder(tokenizer, ContextRoom(64)))
    return tokenizer.decode(call.requests[0].input_ids), tokenizer.kwargs


def test_template_fields_reach_the_template():
    text, kwargs = render()
    assert text == "<user>hi\n<assistant>" and kwargs == {"add_generation_prompt": True}
    text, kwargs = render(add_generation_prompt=False)
    assert text == "<user>hi\n"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
    text, kwargs = render(messages=messages, continue_final_message=True)
    assert text == "<user>hi\n<assistant>Hel"
    assert kwargs == {"add_generation_prompt": False, "continue_final_message": True}
    docs = [{"title": "t", "text": "x"}]
    _, kwargs = render(chat_template_kwargs={"enable_thinking": False}, documents=docs)
    assert kwargs["enable_thinking"] is False and kwargs["documents"] == docs
    text, _ = render(add_special_tokens=True)
    assert text == "\x02<user>hi\n<assistant>"
    _, kwargs = render(reasoning_effort="high")  # gpt-oss's templates read it
    assert kwargs["reasoning_effort"] == "high"
    _, kwargs = render(reasoning_effort="high", chat_template_kwargs={"reasoning_effort": "low"})
    assert kwargs["reasoning_effort"] == "low"  # the template variable given wins


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize"),
        (
            {"chat_template_kwargs": {"chat_template": "{{ 1 }}"}},
            "chat_template_kwargs.chat_template",
        ),
    ],
)
def test_template_fields_refused(fields, param):
    with pytest.raises(APIError) as info:
        render(**fields)
    assert (info.value.status, info.value.param) == (400, param)


def test_completions_honour_add_special_tokens_and_stop_fields():
    prompts = PromptBuilder(RecordingTokenizer(), ContextRoom(64))

    def call(**fields):
        body = CompletionRequest.model_validate({"model": "m", "prompt": "hi", **fields})
        return completion_call(body, prompts).requests[0]

    assert call().input_ids == (2, ord("h"), ord("i"))
    assert call(add_special_tokens=False).input_ids == (ord("h"), ord("i"))
    params = call(stop_regex=r"\d", include_stop_str_in_output=True).sampling_params
    assert params.stop_regex == (r"\d",) and params.no_stop_trim is True
    params = call(include_stop_str_in_output=True, no_stop_trim=False).sampling_params
    assert params.no_stop_trim is False  # radixlm's own name wins
    assert (
        call(spaces_between_special_tokens=False).sampling_params.spaces_between_special_tokens
        is False
    )


def test_generate_sampling_params_of_sglangs():
    assert screen_sampling_params({"sampling_seed": 7, "stream_interval": 2}) == {"seed": 7}
    assert screen_sampling_params([{"custom_params": {}}, {"n": 1}]) == [{}, {"n": 1}]
    assert screen_sampling_params({"logit_bias": {}, "temperature": 0}) == {"temperature": 0}
    assert screen_sampling_params(None) is None
    with pytest.raises(APIError) as info:
        screen_sampling_params([{}, {"logit_bias": {"5": 1.0}}])
    assert info.value.param == "sampling_params.1.logit_bias"
    with pytest.raises(APIError) as info:
        screen_sampling_params({"sampling_seed": 1, "seed": 2})
    assert info.value.param == "sampling_params.sampling_seed"
    with pytest.raises(APIError) as info:
        screen_sampling_params({"sampling_seed": "7"})
    assert info.value.param == "sampling_params.sampling_seed"
    assert SAMPLING_PARAMS.honoured == {"sampling_seed", "min_tokens"}


def test_generate_takes_every_alias_the_sampling_table_gives():
    """An alias is one line of the sampling table (``generate_aliases``): vLLM's
    ``min_tokens`` is ``min_new_tokens``, checked as it is."""
    assert screen_sampling_params({"min_tokens": 3, "max_new_tokens": 8}) == {
        "min_new_tokens": 3,
        "max_new_tokens": 8,
    }
    with pytest.raises(APIError) as info:
        screen_sampling_params({"min_tokens": -1})
    assert info.value.param == "sampling_params.min_tokens"
    assert ">= 0" in str(info.value)
    with pytest.raises(APIError) as info:
        screen_sampling_params([{}, {"min_tokens": 1, "min_new_tokens": 2}])
    assert info.value.param == "sampling_params.1.min_tokens"


# --- every accepted name over HTTP ------------------------------------------------------

SCHEMA = {"type": "object"}
# Valid values for the honoured names (the ignored ones take anything).
HONOURED_VALUES = {
    "structured_outputs": {"choice": ["red", "blue"]},
    "guided_json": SCHEMA,
    "guided_regex": "[0-9]+",
    "guided_choice": ["red", "blue"],
    "guided_grammar": 'root ::= "yes" | "no"',
    "structural_tag": {"type": "structural_tag", "format": {"type": "const_string", "value": "Hi"}},
    "stop_regex": r"\d",
    "add_special_tokens": True,
    "include_stop_str_in_output": True,
    "spaces_between_special_tokens": False,
    "continue_final_message": True,
    "add_generation_prompt": False,
    "chat_template_kwargs": {"enable_thinking": False},
    "documents": [{"title": "Colours", "text": "Red is a colour."}],
    "response_format": {"type": "json_object"},
    "json_schema": SCHEMA,
    "no_logs": True,
    "separate_reasoning": False,
    "include_reasoning": False,
    "reasoning_effort": "low",
}
# A plausible value for an ignored name (any value is accepted).
IGNORED_VALUES = {"priority": 1, "store": False, "metadata": {"k": "v"}, "data_parallel_rank": 0}
BODIES = {
    "/v1/chat/completions": chat_body(max_tokens=1, temperature=0),
    "/v1/completions": {"model": "default", "prompt": "Hi", "max_tokens": 1, "temperature": 0},
    "/generate": {"text": "Hi", "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
}
ROUTE_FIELDS = {fields.route: fields for fields in (CHAT, COMPLETIONS, GENERATE)}


def accepted_cases():
    for route, fields in ROUTE_FIELDS.items():
        for name in sorted(fields.honoured):
            yield pytest.param(route, name, HONOURED_VALUES[name], id=f"{route}:{name}")
        for name in sorted(fields.ignored):
            yield pytest.param(route, name, IGNORED_VALUES.get(name, "x"), id=f"{route}:{name}")
        for name in sorted(fields.unsupported):
            yield pytest.param(route, name, None, id=f"{route}:{name}=null")


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


@pytest.mark.parametrize(("route", "name", "value"), list(accepted_cases()))
def test_each_accepted_name_is_a_200(http, route, name, value):
    response = http.post(route, json={**BODIES[route], name: value})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("route", sorted(ROUTE_FIELDS))
def test_unsupported_names_asking_for_something_are_400s_naming_them(http, route):
    for name, what in ROUTE_FIELDS[route].unsupported.items():
        value = 2 if name == "best_of" else "x"  # best_of "x" is no count: a 400 saying so
        response = http.post(route, json={**BODIES[route], name: value})
        assert response.status_code == 400, (name, response.text)
        error = response.json()["error"]
        assert error["param"] == name and what in error["message"], error


@pytest.mark.parametrize("route", sorted(ROUTE_FIELDS))
def test_a_made_up_name_is_still_a_400_naming_it(http, server, route):
    response = http.post(route, json={**BODIES[route], "rid": "r1", "frobnicate": True})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "frobnicate"
    wait_idle(server.state.engine)


@pytest.mark.parametrize("name", ["stream_interval", "custom_params", "logit_bias"])
def test_generate_takes_sglangs_sampling_params(http, name):
    params = {**BODIES["/generate"]["sampling_params"], name: None if name == "logit_bias" else 2}
    response = http.post("/generate", json={"text": "Hi", "sampling_params": params})
    assert response.status_code == 200, response.text


def test_generate_refuses_logit_biases_and_unknown_sampling_params(http):
    bias = {"max_new_tokens": 2, "logit_bias": {"5": 3.0}}
    response = http.post("/generate", json={"text": "Hi", "sampling_params": bias})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "sampling_params.logit_bias"
    made_up = {"max_new_tokens": 2, "frobnicate": 1}
    response = http.post("/generate", json={"text": "Hi", "sampling_params": made_up})
    assert response.status_code == 400 and response.json()["error"]["param"] == "frobnicate"


def test_sampling_seed_is_seed(http):
    def text(params):
        body = {
            "text": "Colours:",
            "sampling_params": {"max_new_tokens": 4, "temperature": 1.0, **params},
        }
        return http.post("/generate", json=body).json()["text"]

    assert text({"sampling_seed": 5}) == text({"seed": 5})


def test_continue_final_message_continues_it(http, http_engine):
    messages = [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "My favourite colour is"},
    ]
    body = {"model": "default", "messages": messages, "max_tokens": 6, "temperature": 0}
    reply = http.post("/v1/chat/completions", json={**body, "continue_final_message": True}).json()
    prompt = http_engine.tokenizer.apply_chat_template(
        messages, tokenize=False, continue_final_message=True
    )
    assert prompt.endswith("My favourite colour is")
    expected = http_engine.generate(
        input_ids=http_engine.tokenizer(prompt, add_special_tokens=False)["input_ids"],
        sampling_params={"temperature": 0, "max_new_tokens": 6},
    )
    assert reply["choices"][0]["message"]["content"] == expected["text"]
    assert reply["usage"]["prompt_tokens"] == expected["meta_info"]["prompt_tokens"]


# What sglang-router 0.3.2 forwards for a client's {"text": "Hi", ...} / {"model", "messages",
# "max_tokens"} / {"model", "prompt", "max_tokens"} (recorded from the router itself): its
# own typed bodies, with every default it declares written out.
ROUTER_BODIES = {
    "/generate": {
        "text": "Hi",
        "model": None,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 4},
        "return_text_in_logprobs": False,
        "stream": False,
        "log_metrics": True,
        "return_hidden_states": False,
        "background": False,
        "no_logs": False,
        "return_bytes": False,
        "return_entropy": False,
    },
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": "Hi"}],
        "model": "default",
        "logprobs": False,
        "max_completion_tokens": 4,
        "temperature": 0.0,
        "stream": False,
        "no_stop_trim": False,
        "ignore_eos": False,
        "continue_final_message": False,
        "skip_special_tokens": True,
        "separate_reasoning": True,
        "stream_reasoning": True,
        "return_hidden_states": False,
    },
    "/v1/completions": {
        "model": "default",
        "prompt": "Hi",
        "max_tokens": 4,
        "temperature": 0.0,
        "stream": False,
        "echo": False,
        "no_stop_trim": False,
        "ignore_eos": False,
        "skip_special_tokens": True,
        "return_hidden_states": False,
    },
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", sorted(ROUTER_BODIES))
def test_what_sglangs_router_forwards_is_served_as_sent_directly(http, route, stream):
    """The router's additions change nothing: the same text as the client's own body."""
    routed = {**ROUTER_BODIES[route], "stream": stream}
    own = {k: v for k, v in routed.items() if k in ("text", "messages", "prompt", "stream")}
    if route == "/generate":
        own["sampling_params"] = routed["sampling_params"]
    else:
        own |= {"model": "default", "max_tokens": 4, "temperature": 0.0}
    answers = [http.post(route, json=body) for body in (routed, own)]
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    if stream:
        assert answers[0].text.count("data: ") == answers[1].text.count("data: ")
        assert answers[0].text.endswith("data: [DONE]\n\n")
    else:
        texts = [_text(route, a.json()) for a in answers]
        assert texts[0] == texts[1] and texts[0]


def _text(route: str, answer: dict) -> str:
    if route == "/generate":
        return answer["text"]
    choice = answer["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def test_the_server_doc_names_every_accepted_field():
    doc = Path(__file__).parents[5] / "docs" / "server.md"
    section = doc.read_text().split("## Fields from other servers")[1].split("\n## ")[0]
    for fields in (CHAT, COMPLETIONS, GENERATE, SAMPLING_PARAMS):
        missing = [name for name in fields.accepted if f"`{name}`" not in section]
        assert not missing, (fields.route, missing)
