"""Every surface that exposes a sampling parameter accepts exactly the values the engine
accepts: boundary values (just inside and just outside each bound), wrong types and null
sent through SamplingParams, /generate's body, the DSL's gen() and run(), and the chat,
completions and Responses bodies (validated and converted, with a one-token-per-character
tokenizer: no model, no server).

A surface may differ only where its own contract says so; those differences are listed
here (EXCEPTIONS), with their reasons, and must match the table's ``SurfaceBound``s.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

import radixlm as sgl
from radixlm.ir import GenParams
from radixlm.runtime.entrypoints.http.compat.fields import screen_sampling_params
from radixlm.runtime.entrypoints.http.native.routes import GenerateBody
from radixlm.runtime.entrypoints.http.openai.convert import chat_call, completion_call
from radixlm.runtime.entrypoints.http.openai.prompts import PromptBuilder
from radixlm.runtime.entrypoints.http.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
)
from radixlm.runtime.entrypoints.http.responses.convert import responses_call
from radixlm.runtime.entrypoints.http.responses.protocol import ResponsesRequest
from radixlm.runtime.entrypoints.http.server.errors import APIError
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.io.context_room import ContextRoom
from radixlm.runtime.io.sampling_fields import (
    SAMPLING_FIELDS,
    SURFACES,
    Bound,
    SamplingField,
    Surface,
    fields_on,
    sampling_field,
)
from radixlm.runtime.io.sampling_params import SamplingParams
from tests.lang.fake_backend import FakeBackend
from tests.runtime.entrypoints.http.openai.test_openai_convert import CharTokenizer

PROMPTS = PromptBuilder(CharTokenizer(), ContextRoom(4096))
MESSAGES = [{"role": "user", "content": "hi"}]
MISSING = object()  # "send nothing": the field left out

# (field, surface) -> the values the engine accepts and that surface refuses, and why.
# Nothing else may differ: every other value is accepted everywhere or nowhere.
EXCEPTIONS: dict[tuple[str, Surface], tuple[frozenset, str]] = {
    ("max_new_tokens", "chat"): (
        frozenset({0}),
        "a chat turn is the model's reply: max_tokens / max_completion_tokens >= 1",
    ),
    ("max_new_tokens", "responses"): (
        frozenset({0}),
        "a response is the model's reply: max_output_tokens >= 1",
    ),
}
# gen()'s arguments that are no sampling parameters (variables, logprobs, constraints of
# the DSL's own: dtype; choices makes a select).
GEN_OWN_ARGUMENTS = {
    "name",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "dtype",
    "choices",
    "choices_method",
}


# ---- the surfaces: each says whether it accepts one field's value ------------------------


def _refused(run: Callable[[], Any], *errors: type[BaseException]) -> bool:
    """Whether ``run`` refuses its input with one of the surface's own errors (any other
    exception is a bug of the surface and fails the test)."""
    try:
        run()
    except errors:
        return True
    return False


def _wire(name: str, value: Any) -> dict[str, Any]:
    return {} if value is MISSING else {name: value}


def _json(body: dict[str, Any]) -> str:
    return json.dumps(body)  # inf and nan as JSON's Infinity / NaN extensions


def engine(name: str, value: Any) -> bool:
    """Engine.generate's dict (a null is the default, as SGLang's clients send)."""
    run = lambda: SamplingParams.from_dict(_wire(name, value))  # noqa: E731
    return not _refused(run, InvalidRequestError)


def generate(name: str, value: Any) -> bool:
    """/generate: the body model, SGLang's key screening, then the engine's dict."""

    def run() -> None:
        body = GenerateBody.model_validate_json(
            _json({"text": "hi", "sampling_params": _wire(name, value)})
        )
        SamplingParams.from_dict(screen_sampling_params(body.sampling_params))

    return not _refused(run, ValidationError, APIError, InvalidRequestError)


def gen(name: str, value: Any) -> bool:
    """The DSL's gen(): None means the run() default."""
    run = lambda: sgl.gen("x", **_wire(name, value))  # noqa: E731
    return not _refused(run, sgl.ProgramArgumentError)


def run(name: str, value: Any) -> bool:
    """The DSL's run() defaults (a program without gens: no model needed)."""
    program = sgl.function(lambda s: None)
    call = lambda: program.run(backend=FakeBackend(), **_wire(name, value))  # noqa: E731
    return not _refused(call, sgl.ProgramArgumentError)


def chat(name: str, value: Any) -> bool:
    def run() -> None:
        body = {"model": "default", "messages": MESSAGES, **_wire(name, value)}
        chat_call(ChatCompletionRequest.model_validate_json(_json(body)), PROMPTS)

    return not _refused(run, ValidationError, APIError)


def completions(name: str, value: Any) -> bool:
    def run() -> None:
        body = {"model": "default", "prompt": "hi", **_wire(name, value)}
        completion_call(CompletionRequest.model_validate_json(_json(body)), PROMPTS)

    return not _refused(run, ValidationError, APIError)


def responses(name: str, value: Any) -> bool:
    def run() -> None:
        body = {"model": "default", "input": "hi", **_wire(name, value)}
        responses_call(ResponsesRequest.model_validate_json(_json(body)), None, PROMPTS)

    return not _refused(run, ValidationError, APIError)


ACCEPTS: dict[Surface, Callable[[str, Any], bool]] = {
    "engine": engine,
    "generate": generate,
    "gen": gen,
    "run": run,
    "chat": chat,
    "completions": completions,
    "responses": responses,
}


# ---- the values: each bound's edges, wrong types, null ---------------------------------


def _edges(bound: Bound, kind: str) -> list[Any]:
    """Each end of ``bound``, the nearest value inside and outside it, and its extra
    values (top_k's -1) and their neighbours."""
    values: list[Any] = []
    for end in (bound.low, bound.high, *bound.also):
        if end is None:
            continue
        if kind == "int":
            values += [int(end) - 1, int(end), int(end) + 1]
        else:
            values += [math.nextafter(end, -math.inf), end, math.nextafter(end, math.inf)]
    return values


WRONG_TYPES: dict[str, list[Any]] = {
    "float": [True, "1", [1.0], math.inf, -math.inf, math.nan, 1],
    "int": [True, 1.0, "1", [1]],
    "bool": [0, 1, "true", [True], True, False],
    "strings": ["", "x", [], ["x", "y"], [""], 5, [5], ["x", 5]],
    "token_ids": [[], [0], [-1], [True], [1.0], 5, "1", [2**31]],
    "grammar": ["", 5, [], {}, ["a"]],
    "option": ["xgrammar", "nope", 5, True],
}


# Values of fields without a bound worth trying: any int is a seed.
EXTRA_VALUES: dict[str, list[Any]] = {"seed": [0, -1, 2**63]}


def values_of(spec: SamplingField) -> list[Any]:
    bounds = [spec.bound, *(e.bound for e in spec.exceptions)]
    values = [v for b in bounds if b is not None for v in _edges(b, spec.kind)]
    extra = EXTRA_VALUES.get(spec.name, [])
    return [*values, *extra, *WRONG_TYPES[spec.kind], None, MISSING]


# The command line types text, never a list or null: its flags' edges are
# tests/runtime/entrypoints/test_cli_sampling.py's.
CASES = [
    pytest.param(spec, surface, id=f"{spec.name}-{surface}")
    for spec in SAMPLING_FIELDS
    for surface in SURFACES
    if surface not in ("engine", "cli") and spec.names_on(surface)
]


@pytest.mark.parametrize(("spec", "surface"), CASES)
def test_a_surface_accepts_what_the_engine_accepts(spec: SamplingField, surface: Surface):
    excepted, _reason = EXCEPTIONS.get((spec.name, surface), (frozenset(), ""))
    disagreements = []
    for value in values_of(spec):
        on_engine = engine(spec.name, value)
        for name in spec.names_on(surface):
            here = ACCEPTS[surface](name, value)
            expected = on_engine and not _in(value, excepted)
            if here != expected:
                disagreements.append((name, value, f"engine {on_engine}", f"{surface} {here}"))
    assert disagreements == []


def _in(value: Any, values: frozenset) -> bool:
    return type(value) is int and value in values


def test_the_exceptions_are_the_tables_and_each_is_refused_where_listed():
    listed = {(spec.name, e.surface) for spec in SAMPLING_FIELDS for e in spec.exceptions}
    assert listed == set(EXCEPTIONS)
    for (name, surface), (values, _reason) in EXCEPTIONS.items():
        for value in values:
            assert engine(name, value)
            for alias in sampling_field(name).names_on(surface):
                assert not ACCEPTS[surface](alias, value), (name, surface, alias, value)


# ---- the table is SamplingParams', gen's and run()'s ---------------------------------


def test_the_table_is_samplingparams_fields_with_their_defaults():
    fields = dataclasses.fields(SamplingParams)
    assert [f.name for f in fields] == [spec.name for spec in SAMPLING_FIELDS]
    assert {f.name: f.default for f in fields} == {s.name: s.default for s in SAMPLING_FIELDS}
    assert all(spec.names_on("engine") == (spec.name,) for spec in SAMPLING_FIELDS)
    assert all(spec.names_on("generate")[0] == spec.name for spec in SAMPLING_FIELDS)


def test_the_openai_bodies_take_every_field_the_table_names_on_them():
    """Chat's and completions' sampling fields are made from the table: a field added to
    it with ``openai=`` names is a field of both bodies, bounded by its check."""
    for spec in SAMPLING_FIELDS:
        names = spec.names_on("chat")
        if spec.kind in ("grammar", "option") or names != spec.names_on("completions"):
            continue
        for body in (ChatCompletionRequest, CompletionRequest):
            assert set(names) <= set(body.model_fields), (spec.name, body.__name__)


def test_gen_takes_the_tables_keywords_and_records_them_under_the_engines_names():
    keywords = set(inspect.signature(sgl.gen).parameters) - GEN_OWN_ARGUMENTS
    assert keywords == {spec.names_on("gen")[0] for spec in fields_on("gen")}
    sampling = {f.name for f in dataclasses.fields(GenParams)} - GEN_OWN_ARGUMENTS
    # run() sets these two from global_config; no gen() keyword takes them (as SGLang).
    assert sampling - {spec.name for spec in fields_on("gen")} == {
        "skip_special_tokens",
        "spaces_between_special_tokens",
    }
    inside = {"float": 0.5, "int": 1, "bool": True, "strings": ("s",), "token_ids": (1,)}
    for spec in fields_on("gen"):
        if spec.kind in inside:
            value = inside[spec.kind]
            params = sgl.gen("x", **{spec.names_on("gen")[0]: value}).params
            assert getattr(params, spec.name) == value, spec.name


def test_run_defaults_are_the_tables():
    from radixlm.function import _RUN_DEFAULTS  # noqa: PLC0415

    for spec in fields_on("run"):
        default = spec.default if spec.kind in ("float", "int", "bool") else None
        assert _RUN_DEFAULTS[spec.name] == default, spec.name


# ---- the error a bound gives, on every surface ---------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"temperature": 101}, "expected a value in [0, 100], got 101"),
        ({"top_p": 0}, "expected a value in (0, 1], got 0"),
        ({"top_k": 0}, "expected -1 (off) or >= 1, got 0"),
        ({"max_new_tokens": -1}, "expected >= 0, got -1"),
        ({"frequency_penalty": 2.5}, "expected a value in [-2, 2], got 2.5"),
        ({"repetition_penalty": 0.001}, "expected a value in [0.01, 100], got 0.001"),
        ({"json_max_whitespace": 9}, "expected a value in [0, 8], got 9"),
        ({"temperature": math.inf}, "expected a finite number, got inf"),
        ({"n": True}, "expected an int, got True"),
        ({"ignore_eos": 1}, "expected a bool, got 1"),
    ],
)
def test_the_engine_names_the_field_and_its_bound(params: dict, message: str):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**params)
    assert info.value.field == next(iter(params))
    assert info.value.reason == message


def test_an_http_body_out_of_bounds_says_what_the_engine_says():
    body = {"model": "default", "messages": MESSAGES, "top_k": 0}
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate_json(_json(body))
    (error,) = info.value.errors()
    assert (error["loc"], error["msg"]) == (("top_k",), "expected -1 (off) or >= 1, got 0")
    with pytest.raises(ValidationError) as info:
        ResponsesRequest.model_validate_json(_json({"model": "m", "temperature": 100.5}))
    assert info.value.errors()[0]["msg"] == "expected a value in [0, 100], got 100.5"


def test_none_is_a_constructor_value_only_where_the_field_is_nullable():
    for spec in SAMPLING_FIELDS:
        if spec.kind in ("float", "int", "bool"):
            build = functools.partial(SamplingParams, **{spec.name: None})
            refused = _refused(build, InvalidRequestError)
            assert refused != spec.nullable, spec.name
