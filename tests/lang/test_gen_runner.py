"""Gens and selects through a scripted backend: the request a gen becomes, its
result in the store (plain, n > 1, streamed), the meta info, a select's decision."""

from __future__ import annotations

import pytest

import radixlm as sgl
from radixlm.choices import ChoicesDecision, greedy_token_selection
from radixlm.conversation import Conversation
from radixlm.gen_runner import GenRunner, build_request, checked_decision, gen_meta_info
from radixlm.ir import REGEX_INT, Gen, GenParams, Select
from radixlm.runtime.io.chat_template import ChatTemplate
from radixlm.runtime.io.messages import FinishReason, GenerateOutput, LogprobSpec
from radixlm.stream_store import StreamStore
from tests.lang.fake_backend import FakeBackend

# run()'s defaults, as SGLang's (what every gen's own arguments go over)
DEFAULTS = GenParams(
    max_new_tokens=8, temperature=0.0, top_p=1.0, top_k=-1, min_p=0.0,
    frequency_penalty=0.0, presence_penalty=0.0, ignore_eos=False,
)  # fmt: skip


def runner(backend: FakeBackend, stream: bool = False, prompt: str = "Q: ") -> GenRunner:
    store = StreamStore()
    store.append(prompt)
    return GenRunner(backend, DEFAULTS, stream, store, Conversation(backend.chat_template))


def test_a_request_takes_the_params_the_dtype_and_the_turns_stop_tokens():
    params = GenParams(max_new_tokens=4, stop=("\n",), stop_token_ids=(2, 7))
    request = build_request(params.over(DEFAULTS), "int", [5, 6], turn_stop_token_ids=(7, 9))
    sampling = request.sampling_params
    assert request.input_ids == (5, 6)
    assert sampling.regex == REGEX_INT
    assert sampling.stop == ("\n", " ")  # DTYPE_STOP added once
    assert sampling.stop_token_ids == (2, 7, 9)
    assert (sampling.n, sampling.min_new_tokens, sampling.max_new_tokens) == (1, 0, 4)
    assert not request.return_logprob


def test_unset_special_token_options_keep_the_sampling_defaults():
    plain = build_request(DEFAULTS, None, [1]).sampling_params
    asked = GenParams(skip_special_tokens=False, regex="a+").over(DEFAULTS)
    given = build_request(asked, None, [1]).sampling_params
    assert plain.skip_special_tokens is True and given.skip_special_tokens is False
    assert (plain.regex, given.regex) == (None, "a+")


def test_meta_info_carries_token_texts_when_asked():
    out = GenerateOutput(
        rid="r", index=0, text="!", output_ids=(33,), finish_reason=FinishReason("length", 1),
        prompt_tokens=2, cached_tokens=0, e2e_latency=0.0, ttft=None,
        logprob=LogprobSpec(True, 0), prompt_ids=(104, 105),
        prompt_logprobs=((1, (-0.5, 105, [])),), output_logprobs=((-0.1, 33, []),),
    )  # fmt: skip
    asked = GenParams(return_logprob=True, return_text_in_logprobs=True)
    meta = gen_meta_info(out, asked, lambda ids: "".join(map(chr, ids)))
    assert meta["input_token_logprobs"] == [(None, 104, "h"), (-0.5, 105, "i")]
    assert meta["output_token_logprobs"] == [(-0.1, 33, "!")]
    plain = gen_meta_info(out, GenParams(return_logprob=True), chr)
    assert plain["output_token_logprobs"] == [(-0.1, 33, None)]


def test_a_gen_appends_and_sets_its_variable_and_meta_info():
    backend = FakeBackend(replies=["Paris!"])
    gens = runner(backend)
    gens.gen(Gen("a", GenParams(stop=("!",))))
    assert gens.store.text == "Q: Paris" and gens.store.variables == {"a": "Paris"}
    assert gens.store.meta_info["a"]["finish_reason"] == {"type": "stop", "matched": "!"}
    assert backend.decode(backend.requests[0].input_ids) == "Q: "
    assert backend.requests[0].sampling_params.max_new_tokens == 8  # the run() default


def test_n_samples_give_a_list_and_the_first_joins_the_text():
    gens = runner(FakeBackend(replies=["x", "y"]))
    gens.gen(Gen("a", GenParams(n=2)))
    assert gens.store.text == "Q: x" and gens.store.variables["a"] == ["x", "y"]
    assert len(gens.store.meta_info["a"]) == 2


def test_a_streamed_gen_ends_with_the_full_text():
    gens = runner(FakeBackend(replies=["abc"]), stream=True)
    gens.gen(Gen("a"))
    assert gens.store.text == "Q: abc" and gens.store.variables["a"] == "abc"


def test_an_assistant_gen_stops_at_the_end_of_the_turn():
    turn = {"assistant": "A:"}
    template = ChatTemplate("t", turn, {"assistant": "\n"}, turn, stop_token_ids=(3,))
    backend = FakeBackend(chat_template=template)
    gens = runner(backend, prompt="")
    gens.conversation.begin("assistant", gens.store)
    gens.gen(Gen(None))
    assert backend.requests[0].sampling_params.stop_token_ids == (3,)
    assert gens.store.variables == {}


def test_a_select_appends_the_choice_the_method_picks():
    backend = FakeBackend(choice_scores={"no": [-0.1, -0.1], "yes": [-2.0, -2.0, -2.0]})
    gens = runner(backend)
    gens.select(Select("c", ("yes", "no"), 0.0, greedy_token_selection))
    assert gens.store.text == "Q: no" and gens.store.variables == {"c": "no"}
    assert "input_token_logprobs" in gens.store.meta_info["c"]


def test_a_decision_outside_the_choices_is_refused():
    expr = Select("c", ("a", "b"), 0.0, greedy_token_selection)
    assert checked_decision(ChoicesDecision("a"), expr, greedy_token_selection).decision == "a"
    with pytest.raises(ValueError, match=r"returned 'a'; expected a ChoicesDecision"):
        checked_decision("a", expr, greedy_token_selection)


def test_separate_reasoning_over_a_select_keeps_the_choice():
    # A select records where its text is, as a gen does, so that the split can edit it.
    @sgl.function
    def pick(s):
        s += "Q? " + sgl.separate_reasoning(sgl.select("c", choices=["yes", "no"]))

    state = pick.run(backend=FakeBackend())
    assert state.error() is None
    assert state["c"] in ("yes", "no") and state["c_reasoning_content"] == ""
    assert state.text() == f"Q? {state['c']}"
