"""Every tool_choice, in every format, enforced on both grammar backends: a random model
(any token the grammar allows, tests/.../tool_cases.py) over a tokenizer trained here
writes calls that always parse and validate. No model, no engine."""

from __future__ import annotations

import pytest

from radixlm.runtime.config import GrammarConfig
from radixlm.runtime.constrained.spec import GrammarSpec
from radixlm.runtime.entrypoints.http.openai.tools import ToolCalling
from radixlm.runtime.entrypoints.http.server.errors import APIError
from radixlm.runtime.io.context_room import ContextRoom
from radixlm.runtime.tools.format import FORMATS, HERMES, MISTRAL
from radixlm.runtime.tools.plan import ToolPlan
from tests.runtime.tools.tool_cases import (
    TOOLS,
    assert_valid_calls,
    marked_tokenizer,
    marked_vocabulary,
    sample_section,
    vocabulary,
    walk,
)

BACKENDS = ("xgrammar", "llguidance")
SEEDS = range(6)
# xgrammar lets a JSON string with maxLength hold raw control characters (tool_cases).
STRICT = {"xgrammar": False, "llguidance": True}


@pytest.fixture(scope="module")
def backends():
    from radixlm.runtime.constrained.llguidance_backend import LLGuidanceBackend
    from radixlm.runtime.constrained.xgrammar_backend import XGrammarBackend

    vocab, config = vocabulary(), GrammarConfig()
    return {
        "xgrammar": XGrammarBackend(vocab, config),
        "llguidance": LLGuidanceBackend(vocab, config),
    }


def compiled(backends, backend: str, fmt_name: str, plan: ToolPlan):
    fmt = FORMATS[fmt_name]
    constraint = ToolCalling(fmt, GrammarConfig(grammar_backend=backend)).constraint(plan, fmt)
    assert constraint.field == {"xgrammar": "structural_tag", "llguidance": "lark"}[backend]
    return backends[backend].compile(GrammarSpec(constraint.field, constraint.value))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt_name", list(FORMATS))
def test_required_always_writes_valid_calls_and_nothing_else(backends, backend, fmt_name):
    grammar = compiled(backends, backend, fmt_name, ToolPlan(TOOLS, "required"))
    for seed in SEEDS:
        text = walk(grammar, seed)
        parsed = assert_valid_calls(FORMATS[fmt_name], text, strict=STRICT[backend])
        assert parsed.calls and parsed.content == "", text


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt_name", list(FORMATS))
def test_named_writes_one_call_of_that_function(backends, backend, fmt_name):
    plan = ToolPlan(TOOLS, "named", "search_notes", parallel=False)
    grammar = compiled(backends, backend, fmt_name, plan)
    for seed in SEEDS:
        text = walk(grammar, seed)
        parsed = assert_valid_calls(FORMATS[fmt_name], text, ("search_notes",), STRICT[backend])
        assert len(parsed.calls) == 1 and parsed.content == "", text


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt_name", list(FORMATS))
def test_auto_allows_text_and_enforces_calls_once_started(backends, backend, fmt_name):
    fmt = FORMATS[fmt_name]
    grammar = compiled(backends, backend, fmt_name, ToolPlan(TOOLS, "auto"))
    for seed in SEEDS:  # the model starts a call: the rest is the grammar's
        text = walk(grammar, seed, prefix="Sure. " + fmt.trigger)
        parsed = assert_valid_calls(fmt, text, strict=STRICT[backend])
        assert parsed.calls and parsed.content == "Sure.", text
    plain = walk(grammar, 0, prefix="The answer is 42.")  # or it answers in text
    assert assert_valid_calls(fmt, plain).calls == ()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt_name", list(FORMATS))
def test_a_written_section_is_accepted_whole(backends, backend, fmt_name):
    """The format's own rendering (what templates and the fallback prompt show) is in the
    grammar: the grammar is not stricter than the format."""
    fmt = FORMATS[fmt_name]
    for choice in ("required", "auto"):
        grammar = compiled(backends, backend, fmt_name, ToolPlan(TOOLS, choice))
        section = sample_section(fmt, ("get_weather", "search_notes", "get_time"))
        text = walk(grammar, 0, prefix=section)  # then an end, or more calls
        calls = assert_valid_calls(fmt, text, strict=STRICT[backend]).calls
        assert text.startswith(section) and len(calls) >= 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_parallel_false_stops_after_one_call(backends, backend):
    grammar = compiled(backends, backend, "mistral", ToolPlan(TOOLS, "required", parallel=False))
    for seed in SEEDS:
        text = walk(grammar, seed)
        assert len(assert_valid_calls(MISTRAL, text, strict=STRICT[backend]).calls) == 1


def test_none_has_no_grammar_and_outlines_is_refused():
    assert ToolCalling().constraint(ToolPlan(TOOLS, "none"), HERMES) is None
    outlines = ToolCalling(HERMES, GrammarConfig(grammar_backend="outlines"))
    with pytest.raises(APIError) as e:
        outlines.constraint(ToolPlan(TOOLS, "auto"), HERMES)
    assert e.value.status == 400 and e.value.param == "tools"
    assert e.value.message == (
        "tool calls are enforced by a structural tag or a Lark grammar, which this server's "
        "grammar backend 'outlines' does not compile (grammar_backend 'xgrammar' or "
        "'llguidance' does)"
    )


def test_the_kind_is_the_first_the_backend_compiles():
    plan = ToolPlan(TOOLS, "auto")
    kinds = {
        backend: ToolCalling(HERMES, GrammarConfig(grammar_backend=backend))
        .constraint(plan, HERMES)
        .field
        for backend in ("auto", "xgrammar", "llguidance")
    }
    assert kinds == {"auto": "structural_tag", "xgrammar": "structural_tag", "llguidance": "lark"}


def test_llguidance_refuses_an_arguments_schema_it_cannot_enforce_by_name():
    from radixlm.runtime.errors import GrammarError
    from radixlm.runtime.tools.plan import FunctionTool

    tricky = FunctionTool("f", None, {"type": "object", "properties": {"a": {"minimum": "x"}}})
    calling = ToolCalling(HERMES, GrammarConfig(grammar_backend="llguidance"))
    with pytest.raises(GrammarError):
        calling.constraint(ToolPlan((tricky,), "required"), HERMES)


# ---- through chat_call: the request's format, the engine's backend, the prompt -----------


def chat_body(**fields):
    from radixlm.runtime.entrypoints.http.openai.protocol import ChatCompletionRequest

    tools = [t.to_openai() for t in TOOLS]
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    return ChatCompletionRequest.model_validate({**body, **fields})


def prompts(backend: str = "auto", fmt=HERMES):
    from radixlm.runtime.entrypoints.http.openai.prompts import PromptBuilder
    from tests.runtime.entrypoints.http.openai.test_openai_convert import CharTokenizer

    calling = ToolCalling(fmt, GrammarConfig(grammar_backend=backend))
    return PromptBuilder(CharTokenizer(), ContextRoom(4096), tool_calling=calling)


def prompt_text(call) -> str:
    return "".join(chr(i) for i in call.requests[0].input_ids)


def test_the_engines_backend_picks_the_grammars_form():
    from radixlm.runtime.entrypoints.http.openai.convert import chat_call

    params = chat_call(chat_body(tool_choice="required"), prompts("llguidance")).requests[0]
    assert params.sampling_params.lark is not None and params.sampling_params.structural_tag is None
    call = chat_call(chat_body(), prompts("xgrammar"))
    assert call.requests[0].sampling_params.structural_tag is not None
    assert call.param_names["structural_tag"] == "tools" and call.param_names["lark"] == "tools"


def test_the_servers_format_shapes_prompt_grammar_and_parser():
    from radixlm.runtime.entrypoints.http.openai.convert import chat_call

    call = chat_call(chat_body(), prompts(fmt=MISTRAL))
    assert "[TOOL_CALLS] [" in prompt_text(call)  # the fallback prompt shows the format
    assert call.tool_parser is not None and call.tool_parser.format is MISTRAL
    assert "[TOOL_CALLS]" in call.requests[0].sampling_params.structural_tag
    none = chat_call(chat_body(tool_choice="none"), prompts(fmt=MISTRAL))
    assert none.tool_parser is None and none.requests[0].sampling_params.structural_tag is None


def test_a_request_may_name_its_own_format():
    from radixlm.runtime.entrypoints.http.openai.convert import chat_call
    from radixlm.runtime.tools.format import QWEN3_CODER

    call = chat_call(chat_body(tool_call_parser="qwen3_coder"), prompts(fmt=MISTRAL))
    assert call.tool_parser.format is QWEN3_CODER and "<parameter=" in prompt_text(call)


def test_a_parser_name_that_does_not_exist_is_a_400_naming_the_field():
    from radixlm.runtime.entrypoints.http.openai.convert import chat_call

    with pytest.raises(APIError) as e:
        chat_call(chat_body(tool_call_parser="hermes2"), prompts())
    assert e.value.status == 400
    error = e.value.body()["error"]
    assert error["param"] == "tool_call_parser" and error["type"] == "invalid_request_error"
    assert "'hermes2'" in error["message"] and "llama3_json" in error["message"]


def test_an_arguments_schema_llguidance_refuses_is_a_400_naming_tools():
    from radixlm.runtime.entrypoints.http.openai.convert import chat_call

    bad = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "format": "idn-hostname"}}
    }}}  # fmt: skip
    with pytest.raises(APIError) as e:
        chat_call(chat_body(tools=[bad], tool_choice="required"), prompts("llguidance"))
    assert e.value.status == 400 and e.value.param == "tools", e.value.body()


@pytest.fixture(scope="module")
def marked_backends():
    """Each format's backends over the vocabulary variant that spells its marker tokens
    (a tokenizer where every format's markers are special tokens)."""
    from radixlm.runtime.constrained.llguidance_backend import LLGuidanceBackend
    from radixlm.runtime.constrained.xgrammar_backend import XGrammarBackend

    built = {}
    for fmt in FORMATS.values():
        vocab = marked_vocabulary().with_special_tokens(fmt.tokens)
        built[fmt.name] = {
            "xgrammar": XGrammarBackend(vocab, GrammarConfig()),
            "llguidance": LLGuidanceBackend(vocab, GrammarConfig()),
        }
    return built


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt_name", list(FORMATS))
def test_marker_tokens_start_and_shape_calls_when_they_are_special(
    marked_backends, backend, fmt_name
):
    """The model writes the format's first marker as its one special token (Llama 3's
    <|python_tag|>, before its JSON): under "auto" the call starts there; under
    "required" the grammar writes the markers itself. Every call parses and validates."""
    fmt = FORMATS[fmt_name]
    tok = marked_tokenizer()
    marker = (fmt.ignored_before or fmt.tokens)[0]
    marker_id = tok.convert_tokens_to_ids(marker)
    assert marker_id in marked_vocabulary().special.values()
    for choice in ("auto", "required"):
        plan = ToolPlan(TOOLS, choice)
        constraint = ToolCalling(fmt, GrammarConfig(grammar_backend=backend)).constraint(plan, fmt)
        spec = GrammarSpec(constraint.field, constraint.value)
        grammar = marked_backends[fmt_name][backend].compile(spec)
        prefix = "Sure. " + marker if choice == "auto" else ""
        for seed in SEEDS[:3]:
            text = walk(grammar, seed, prefix=prefix, marked=True)
            parsed = assert_valid_calls(fmt, text, strict=STRICT[backend])
            assert parsed.calls and parsed.content == ("Sure." if prefix else ""), text
