"""The OpenAI backend against a real radixlm server on 127.0.0.1 (its OpenAI routes),
compared with the same programs in process; and what it refuses, by name."""

from __future__ import annotations

import json

import jsonschema
import pytest

import radixlm as sgl
from radixlm.backends.base import UnsupportedInputError
from tests.lang.user_methods import LeastLikely
from tests.servers import running_server

GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server(engine):
    with running_server(engine) as running:
        yield running


@pytest.fixture(scope="module")
def chat(server):
    with sgl.OpenAI("default", base_url=server.base_url + "/v1", api_key="none") as backend:
        yield backend


@pytest.fixture(scope="module")
def completion(server):
    url = server.base_url + "/v1"
    with sgl.OpenAI("default", base_url=url, api_key="none", is_chat_model=False) as backend:
        yield backend


@sgl.function
def qa(s, question):
    s += sgl.system("You are terse.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=12, stop="."))


def test_a_chat_program_gets_the_servers_chat_completion(chat, engine):
    state = qa.run("What is the capital of France?", backend=chat, **GREEDY)
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    prompt = engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    expected = engine.generate(prompt, {"max_new_tokens": 12, "stop": ".", "temperature": 0})
    assert state["answer"] == expected["text"]
    assert state.text().endswith(state["answer"] + "<|im_end|>\n")
    assert state.get_meta_info("answer")["finish_reason"]["type"] in ("stop", "length")


def test_json_schema_goes_as_response_format(chat):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    }

    @sgl.function
    def city(s):
        s += sgl.user("Name a city as JSON.")
        s += sgl.assistant(sgl.gen("json", max_tokens=40, json_schema=json.dumps(schema)))

    value = json.loads(city.run(backend=chat, **GREEDY)["json"])
    jsonschema.validate(value, schema)


def test_streamed_chat_gen_equals_the_whole(chat):
    whole = qa.run("Name a color.", backend=chat, **GREEDY)["answer"]
    state = qa.run("Name a color.", backend=chat, stream=True, **GREEDY)
    pieces = "".join(state.text_iter("answer"))
    assert pieces == whole and state["answer"] == whole


@sgl.function
def pick(s):
    s += "The capital of France is" + sgl.select("city", choices=[" Paris", " London"])


def test_select_on_a_completion_model_matches_the_in_process_scores(completion, engine):
    remote = pick.run(backend=completion)
    local = pick.run(backend=sgl.Runtime(engine=engine))
    assert remote["city"] == local["city"]
    assert remote.get_meta_info("city")["normalized_prompt_logprobs"] == pytest.approx(
        local.get_meta_info("city")["normalized_prompt_logprobs"], abs=1e-4
    )


def test_a_user_written_choices_method_decides_on_a_completion_model(completion, engine):
    @sgl.function
    def pick_by(s, method):
        s += "The capital of France is"
        s += sgl.select("city", choices=[" Paris", " London"], choices_method=method)

    remote = pick_by.run(LeastLikely(unconditional=True), backend=completion)
    local = pick_by.run(LeastLikely(unconditional=True), backend=sgl.Runtime(engine=engine))
    normalized = remote.get_meta_info("city")["normalized"]
    assert remote["city"] == [" Paris", " London"][normalized.index(min(normalized))]
    assert remote["city"] == local["city"]
    unconditional = remote.get_meta_info("city")["unconditional"]
    assert [len(c) for c in unconditional] == [
        len(c) for c in remote.get_meta_info("city")["input"]
    ]


def test_a_completion_gen_sends_the_text_as_it_is(completion, engine):
    @sgl.function
    def cont(s):
        s += "Once upon a time" + sgl.gen("more", max_tokens=8)

    state = cont.run(backend=completion, **GREEDY)
    assert (
        state["more"]
        == engine.generate("Once upon a time", {"max_new_tokens": 8, **GREEDY})["text"]
    )


@pytest.mark.parametrize(
    ("gen", "message"),
    [
        (lambda: sgl.gen("x", max_tokens=4, regex="[0-9]+"), "'regex'"),
        (lambda: sgl.gen("x", max_tokens=4, top_k=5), "'top_k'"),
        (lambda: sgl.gen("x", max_tokens=4, ignore_eos=True), "'ignore_eos'"),
    ],
)
def test_what_the_api_cannot_express_is_refused_by_name(chat, gen, message):
    @sgl.function
    def prog(s):
        s += sgl.user("Hi")
        s += sgl.assistant(gen())

    state = prog.run(backend=chat)
    assert isinstance(state.error(), UnsupportedInputError)
    assert message in str(state.error())


def test_chat_models_refuse_select_and_text_outside_role_blocks(chat):
    state = pick.run(backend=chat)
    assert isinstance(state.error(), UnsupportedInputError) and "select" in str(state.error())

    @sgl.function
    def loose(s):
        s += "Free text " + sgl.gen("x", max_tokens=4)

    state = loose.run(backend=chat)
    assert isinstance(state.error(), UnsupportedInputError)
    assert "assistant_begin" in str(state.error())
