"""Reasoning models end to end on a tiny random-weight model whose tokenizer holds
``<think>`` / ``</think>``: the section is sampled without the constraint, the answer
after it with it, ``max_reasoning_tokens`` forces the end."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixlm.runtime.config import ConfigError
from radixlm.runtime.entrypoints.engine import Engine
from radixlm.runtime.errors import InvalidSamplingParamsError
from radixlm.runtime.reasoning import Phase, reasoning_format, split_reasoning
from tests.runtime.reasoning.model import (
    ENGINE_OPTIONS,
    SCHEMA,
    chat_prompt,
    write_reasoning_model,
)

QWEN3 = reasoning_format("qwen3")


@pytest.fixture(scope="module")
def thinker(tmp_path_factory, default_model_dir):
    directory = write_reasoning_model(tmp_path_factory.mktemp("reasoning"), default_model_dir)
    engine = Engine(model_path=str(directory), **ENGINE_OPTIONS)
    yield engine
    engine.shutdown()


def end_id(thinker) -> int:
    (token,) = thinker.reasoning.end_ids
    return token


def test_the_parser_is_detected_from_the_chat_template(thinker):
    assert thinker.reasoning.format == QWEN3  # the template reads enable_thinking
    assert thinker.reasoning.end_ids == tuple(thinker.tokenizer.encode("</think>"))


def test_the_thinking_is_unconstrained_and_the_answer_is_schema_valid(thinker, check_no_leaks):
    prompt = chat_prompt(thinker.tokenizer)
    params = {"temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(SCHEMA)}
    out = thinker.generate(prompt, {**params, "max_reasoning_tokens": 8})
    assert out["meta_info"]["finish_reason"]["type"] == "stop", out
    ids = out["output_ids"]
    assert ids.index(end_id(thinker)) == 8  # eight tokens of thinking, then the end
    parts = split_reasoning(out["text"], QWEN3, Phase.REASONING)
    # The random model thinks in words the schema forbids (an object starts with "{").
    assert parts.reasoning and not parts.reasoning.startswith("{")
    jsonschema.validate(json.loads(parts.content), SCHEMA)
    check_no_leaks(thinker)


def test_with_thinking_off_in_the_template_the_constraint_starts_at_once(thinker):
    prompt = chat_prompt(thinker.tokenizer, thinking=False)  # ... <think>\n\n</think>\n\n
    params = {"temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(SCHEMA)}
    out = thinker.generate(prompt, params)
    assert end_id(thinker) not in out["output_ids"]
    jsonschema.validate(json.loads(out["text"]), SCHEMA)


@pytest.mark.parametrize("budget", [0, 1, 5])
def test_max_reasoning_tokens_forces_the_end_marker(thinker, budget, check_no_leaks):
    prompt = chat_prompt(thinker.tokenizer)
    params = {"temperature": 1.0, "seed": 7, "max_new_tokens": 12, "ignore_eos": True}
    out = thinker.generate(prompt, {**params, "max_reasoning_tokens": budget})
    assert out["output_ids"][budget] == end_id(thinker)
    assert len(out["output_ids"]) == 12  # max_new_tokens still counts every token
    check_no_leaks(thinker)


def test_logprobs_and_stop_strings_still_behave(thinker):
    prompt = chat_prompt(thinker.tokenizer)
    schema = json.dumps(SCHEMA)
    params = {"temperature": 0, "max_new_tokens": 64, "json_schema": schema}
    out = thinker.generate(
        prompt, {**params, "max_reasoning_tokens": 4}, return_logprob=True, top_logprobs_num=2
    )
    logprobs = out["meta_info"]["output_token_logprobs"]
    assert [entry[1] for entry in logprobs] == out["output_ids"]  # forced tokens too
    thought = split_reasoning(out["text"], QWEN3, Phase.REASONING).reasoning
    word = thought.split()[-1]
    stopped = thinker.generate(prompt, {**params, "max_reasoning_tokens": 4, "stop": [word]})
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}


@pytest.mark.parametrize("thinking", [True, False])
def test_jump_forward_starts_with_the_answer(thinker, thinking, check_no_leaks):
    prompt = chat_prompt(thinker.tokenizer, thinking)
    schema = json.dumps({**SCHEMA, "properties": {"ok": {"const": "yes"}}})
    params = {"temperature": 0, "max_new_tokens": 64, "json_schema": schema}
    jumped = thinker.get_stats().num_jump_forward_tokens
    out = thinker.generate(prompt, {**params, "jump_forward": True, "max_reasoning_tokens": 3})
    assert thinker.get_stats().num_jump_forward_tokens > jumped  # the answer was forced
    parts = split_reasoning(out["text"], QWEN3, Phase.REASONING if thinking else Phase.ANSWER)
    assert json.loads(parts.content) == {"ok": "yes"}
    assert (end_id(thinker) in out["output_ids"]) is thinking
    check_no_leaks(thinker)


def test_requests_of_a_batch_keep_their_own_phase(thinker, check_no_leaks):
    on, off = chat_prompt(thinker.tokenizer), chat_prompt(thinker.tokenizer, thinking=False)
    params = {"temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(SCHEMA)}
    budgets = [{**params, "max_reasoning_tokens": n} for n in (3, 3, 6)]
    outs = thinker.generate([on, off, on], budgets)
    assert [o["output_ids"].index(end_id(thinker)) for o in (outs[0], outs[2])] == [3, 6]
    jsonschema.validate(json.loads(outs[1]["text"]), SCHEMA)
    check_no_leaks(thinker)


def test_an_unknown_parser_name_is_a_config_error(default_model_dir):
    with pytest.raises(ConfigError, match="unknown reasoning parser 'nope'.*qwen3"):
        Engine(model_path=str(default_model_dir), reasoning_parser="nope")


def test_max_reasoning_tokens_needs_an_engine_with_a_reasoning_parser(engine):
    assert engine.reasoning is None  # the default model's template has no think block
    with pytest.raises(InvalidSamplingParamsError, match="max_reasoning_tokens.*--reasoning"):
        engine.generate("Hi", {"max_reasoning_tokens": 3})
    with pytest.raises(InvalidSamplingParamsError, match="max_reasoning_tokens"):
        engine.generate("Hi", {"max_reasoning_tokens": -1})


def test_a_dsl_gen_takes_max_reasoning_tokens(thinker, check_no_leaks):
    """gen(max_reasoning_tokens=...) reaches the engine (a field of the sampling table,
    so a gen keyword): the DSL's text is the engine's for the same budget."""
    import radixlm as sgl
    from radixlm.backends.runtime import Runtime

    @sgl.function
    def think(s, prompt, budget):
        s += prompt
        s += sgl.gen("answer", max_tokens=12, ignore_eos=True, max_reasoning_tokens=budget)

    prompt = chat_prompt(thinker.tokenizer)
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    runtime = Runtime(engine=thinker)
    try:
        for budget in (0, 3):
            want = thinker.generate(prompt, {**params, "max_reasoning_tokens": budget})
            assert want["output_ids"][budget] == end_id(thinker)
            state = think.run(prompt, budget, backend=runtime, temperature=0)
            assert state["answer"] == want["text"]
    finally:
        runtime.shutdown()
    check_no_leaks(thinker)
