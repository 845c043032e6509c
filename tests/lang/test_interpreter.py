"""The interpreter's semantics on a scripted backend (no model): text, variables,
roles, forks and joins, streaming, errors, batches, tracing."""

from __future__ import annotations

import asyncio

import pytest

import radixlm as sgl
from radixlm.choices import ChoicesDecision, ChoicesSamplingMethod
from radixlm.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_JSON_STR, REGEX_STR
from radixlm.runtime.io.chat_template import FALLBACK
from tests.lang.fake_backend import FakeBackend
from tests.lang.user_methods import LeastLikely


def run(program, backend, **kwargs):
    return program.run(backend=backend, **kwargs)


def test_text_variables_and_role_blocks():
    @sgl.function
    def qa(s, question):
        s += sgl.system("Be brief.")
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=16))
        with s.user():
            s += "And?"
        s += sgl.assistant(sgl.gen("more", stop="!"))

    backend = FakeBackend(replies=["Paris", "Lyon! and more"])
    state = run(qa, backend, question="Capital?")
    assert state["answer"] == "Paris" and state["more"] == "Lyon"
    assert state.text() == (
        "System: Be brief.\nUser: Capital?\nAssistant: Paris\nUser: And?\nAssistant: Lyon\n"
    )
    assert state.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital?"},
        {"role": "assistant", "content": "Paris"},
        {"role": "user", "content": "And?"},
        {"role": "assistant", "content": "Lyon"},
    ]
    first = backend.requests[0]
    assert backend.decode(first.input_ids) == "System: Be brief.\nUser: Capital?\nAssistant: "
    assert first.sampling_params.max_new_tokens == 16
    assert backend.requests[1].sampling_params.stop == ("!",)
    assert "answer" in state and "nothing" not in state
    assert state.get_meta_info("more")["finish_reason"] == {"type": "stop", "matched": "!"}


def test_run_defaults_are_sglangs_and_a_gen_overrides_them():
    @sgl.function
    def two(s):
        s += sgl.gen("a") + sgl.gen("b", temperature=0.5, max_tokens=3)

    backend = FakeBackend()
    run(two, backend)
    a, b = (r.sampling_params for r in backend.requests)
    assert (a.temperature, a.max_new_tokens, a.top_p, a.top_k) == (1.0, 128, 1.0, -1)
    assert (b.temperature, b.max_new_tokens) == (0.5, 3)
    backend.requests.clear()
    run(two, backend, temperature=0.0, max_new_tokens=9)
    assert backend.requests[0].sampling_params.max_new_tokens == 9
    assert backend.requests[0].sampling_params.temperature == 0.0


def test_dtypes_become_sglangs_regexes_and_stop_regex_cuts():
    @sgl.function
    def typed(s):
        s += (
            sgl.gen_int("n") + sgl.gen("f", dtype=float, stop="x") + sgl.gen("t", stop_regex=r"\d+")
        )
        s += sgl.gen("b", dtype=bool) + sgl.gen_string("w") + sgl.gen("j", regex=REGEX_JSON_STR)

    backend = FakeBackend(replies=["42 and more", "3.5\n", "abc123def", "True", '"a b"', '"q"'])
    state = run(typed, backend)
    assert state["n"] == "42" and state["f"] == "3.5" and state["t"] == "abc"  # cut at " ", "\n"
    assert state.text() == '423.5abcTrue"a b""q"'
    params = [r.sampling_params for r in backend.requests]
    assert [p.regex for p in params] == [
        REGEX_INT, REGEX_FLOAT, None, REGEX_BOOL, REGEX_STR, REGEX_JSON_STR
    ]  # fmt: skip
    assert [p.stop for p in params] == [(" ", "\n"), ("x", " ", "\n"), (), (), (), ()]
    assert params[2].stop_regex == (r"\d+",)  # sent to the engine, which cuts there


def test_select_picks_by_method_and_reports_each_choice():
    @sgl.function
    def pick(s, method):
        s += "Q: "
        s += sgl.select("x", choices=["ab", "c"], choices_method=method)

    scores = {"ab": [-1.5, -0.1], "c": [-1.0]}
    normalized = run(pick, FakeBackend(choice_scores=scores), method=sgl.token_length_normalized)
    greedy = run(pick, FakeBackend(choice_scores=scores), method=sgl.greedy_token_selection)
    assert normalized["x"] == "ab" and greedy["x"] == "c"
    assert normalized.text() == "Q: ab"
    meta = normalized.get_meta_info("x")
    assert meta["input_token_logprobs"] == [[(-1.5, ord("a"), None), (-0.1, ord("b"), None)],
                                            [(-1.0, ord("c"), None)]]  # fmt: skip


def test_a_user_written_choices_method_picks_and_fills_the_meta_info():
    @sgl.function
    def pick(s, method):
        s += "Q: "
        s += sgl.select("x", choices=["ab", "c"], choices_method=method)

    scores = {"ab": [-1.5, -0.1], "c": [-1.0]}
    plain = run(pick, FakeBackend(choice_scores=scores), method=LeastLikely())
    assert plain["x"] == "c" and plain.text() == "Q: c"  # c: -1.0 < ab: -0.8
    assert plain.get_meta_info("x")["input"][1] == [(-1.0, ord("c"), None)]
    assert plain.get_meta_info("x")["unconditional"] is None
    backend = FakeBackend(choice_scores=scores)
    unconditional = run(pick, backend, method=LeastLikely(unconditional=True))
    tokens = unconditional.get_meta_info("x")["unconditional"]
    assert [[tok for _, tok, _ in choice] for choice in tokens] == [
        [ord("a"), ord("b")],
        [ord("c")],
    ]
    assert [backend.decode(r.input_ids) for r in backend.requests[2:]] == ["ab", "c"]  # no prompt


def test_a_choices_method_that_picks_no_choice_fails_the_select():
    class Invents(ChoicesSamplingMethod):
        def __call__(self, **_):
            return ChoicesDecision("maybe")

    @sgl.function
    def pick(s):
        s += sgl.select("x", choices=["yes", "no"], choices_method=Invents())

    state = run(pick, FakeBackend())
    assert isinstance(state.error(), ValueError) and "Invents returned" in str(state.error())
    assert state.text() == ""


def test_select_sends_one_scoring_request_per_choice_from_the_shared_prefix():
    @sgl.function
    def pick(s):
        s += "Say: "
        s += sgl.select("x", choices=["yes", "no"])

    backend = FakeBackend()
    run(pick, backend)
    assert [r.sampling_params.max_new_tokens for r in backend.requests] == [0, 0]
    assert [backend.decode(r.input_ids) for r in backend.requests] == ["Say: yes", "Say: no"]
    assert {r.logprob_start_len for r in backend.requests} == {len("Say: ")}


def test_fork_branches_start_from_the_parent_and_join_gathers_in_order():
    @sgl.function
    def branches(s):
        s += "Root."
        s["kept"] = "v"
        forks = s.fork(3)
        forks += lambda i: f" B{i}:"
        forks += sgl.gen("r", max_tokens=8)
        assert forks[1]["kept"] == "v"
        forks.join()

    backend = FakeBackend(replies=["x", "y", "z"])
    state = run(branches, backend)
    assert sorted(state["r"]) == ["x", "y", "z"]  # branches run concurrently: any order of replies
    assert state.text() == "Root."  # branches never write into the parent
    assert backend.cached_prefixes == [tuple(ord(c) for c in "Root.")]  # computed once
    prompts = sorted(backend.decode(r.input_ids) for r in backend.requests)
    assert prompts == ["Root. B0:", "Root. B1:", "Root. B2:"]


def test_join_concate_and_append_appends_the_branch_texts_in_order():
    @sgl.function
    def prog(s):
        s += "A"
        forks = s.fork(3)
        forks += [" one", " two", " three"]
        forks.join("concate_and_append")
        s += "."

    state = run(prog, FakeBackend())
    assert state.text() == "A one two three."
    with pytest.raises(ValueError, match="join mode"):

        @sgl.function
        def bad(s):
            s.fork(2).join("merge")

        run(bad, FakeBackend())


def test_copy_var_scope_and_set_var():
    @sgl.function
    def prog(s):
        with s.var_scope("intro"):
            s += "Hello " + sgl.gen("name", max_tokens=5)
        with s.copy() as c:
            c += sgl.gen("side", max_tokens=5)
        s.set_var("manual", 7)

    state = run(prog, FakeBackend(replies=["Ann", "note"]))
    assert state["intro"] == "Hello Ann" and state["side"] == ["note"] and state["manual"] == 7
    assert state.text() == "Hello Ann"


def test_gen_n_gives_a_list_and_the_first_sample_joins_the_text():
    @sgl.function
    def prog(s):
        s += sgl.gen("many", n=3, max_tokens=4)

    state = run(prog, FakeBackend(replies=["a", "b", "c"]))
    assert state["many"] == ["a", "b", "c"] and state.text() == "a"


def test_a_body_exception_propagates_and_a_gen_failure_is_kept():
    @sgl.function
    def raises(s):
        s += "x"
        raise KeyError("from the body")

    with pytest.raises(KeyError, match="from the body"):
        run(raises, FakeBackend())

    class Failing(FakeBackend):
        def generate(self, requests):
            raise sgl.InvalidRequestError("no room")

    @sgl.function
    def fails(s):
        s += sgl.gen("a") + " after " + sgl.gen("b")

    state = run(fails, Failing())
    assert isinstance(state.error(), sgl.InvalidRequestError) and state.text() == ""
    with pytest.raises(KeyError, match="the program failed"):
        state["a"]


def test_images_are_refused_on_a_text_only_backend():
    @sgl.function
    def look(s):
        s += sgl.user(sgl.image("cat.png") + "What is this?")

    with pytest.raises(sgl.UnsupportedInputError, match="text-only"):
        run(look, FakeBackend())


def test_separate_reasoning_moves_the_think_block_out():
    @sgl.function
    def reason(s):
        s += "Q? " + sgl.separate_reasoning(sgl.gen("a", max_tokens=64), model_type="qwen3")
        s += " done"

    state = run(reason, FakeBackend(replies=["<think>two steps</think>42"]))
    assert state["a"] == "42" and state["a_reasoning_content"] == "two steps"
    assert state.text() == "Q? 42 done"


def test_streaming_chunks_concatenate_to_the_final_text():
    @sgl.function
    def prog(s):
        s += "Start "
        s += sgl.gen("a", max_tokens=32) + " end"

    state = prog.run(backend=FakeBackend(replies=["streamed words"]), stream=True)
    pieces = list(state.text_iter())
    assert "".join(pieces) == state.text() == "Start streamed words end" and len(pieces) > 2
    again = prog.run(backend=FakeBackend(replies=["abc"]), stream=True)
    assert "".join(again.text_iter("a")) == "abc"

    async def collect():
        streamed = prog.run(backend=FakeBackend(replies=["xyz"]), stream=True)
        return "".join([p async for p in streamed.text_async_iter()])

    assert asyncio.run(collect()) == "Start xyz end"


def test_run_batch_keeps_input_order_and_takes_tuples():
    @sgl.function
    def echo(s, word, suffix="!"):
        s["word"] = word
        s += word + suffix

    backend = FakeBackend()
    words = [f"w{i}" for i in range(20)]
    states = echo.run_batch([{"word": w} for w in words], backend=backend, num_threads=4)
    assert [s.text() for s in states] == [w + "!" for w in words]
    tuples = echo.run_batch([("a", "?"), ("b", ".")], backend=backend)
    assert [s.text() for s in tuples] == ["a?", "b."]
    lazy = echo.run_batch([{"word": "z"}], backend=backend, generator_style=True)
    assert [s.text() for s in lazy] == ["z!"]


def test_bind_call_trace_and_cache():
    @sgl.function
    def prog(s, topic, style):
        s += sgl.system("You write " + style + ".")
        s += sgl.user("About " + topic)
        s += sgl.assistant(sgl.gen("text"))

    backend = FakeBackend(replies=["a poem"])
    poem = prog.bind(style="poems")
    assert poem(topic="cats", backend=backend).text().endswith("Assistant: a poem\n")
    nodes = poem.trace()
    assert len(nodes) == 3
    prefix = poem.cache(backend)
    assert prefix == FALLBACK.prefix_and_suffix("system", 0)[0] + "You write poems.\nUser: About "
    assert backend.cached_prefixes[-1] == tuple(ord(c) for c in prefix)
    with pytest.raises(TypeError, match="no arguments"):
        prog.bind(colour="red")

    @sgl.function
    def choose(s, question, choices):
        s += "Shared prefix. Q: " + question
        s += sgl.select("pick", choices)

    assert choose.cache(backend) == "Shared prefix. Q: "  # choices unknown: traced up to there


def test_default_backend_flush_cache_and_server_info():
    backend = FakeBackend(replies=["hi"])
    previous = sgl.get_default_backend()
    sgl.set_default_backend(backend)
    try:

        @sgl.function
        def prog(s):
            s += sgl.gen("a")

        assert prog()["a"] == "hi"
        assert sgl.flush_cache() is True and sgl.get_server_info() == {"model_path": "fake"}
    finally:
        sgl.set_default_backend(previous)
